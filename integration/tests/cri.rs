//! Kubernetes' path: containerd's CRI plugin with Belayer registered as runtime handler `belayer`
//! by the shipped `configs/containerd/config-2.x.toml` (what a RuntimeClass `handler: belayer`
//! selects), driven through the CRI API as the kubelet drives it. A pod's sandbox and its
//! container share one Belayer shim; the container checkpoints and restores in namespace
//! `k8s.io` while CRI keeps seeing it running; Kubernetes' own checkpoint (CRI
//! `CheckpointContainer`) writes an archive that holds a Belayer full checkpoint, and a container
//! created from that archive (Kubernetes' restore) runs from it, processes and filesystem;
//! removing the pod leaves nothing behind.
//!
//! There is no kubelet or crictl on these machines (neither is packaged in Debian): the test is
//! the CRI client. Pods use the host's network (no CNI here).

mod common;

use std::path::PathBuf;
use std::time::Duration;

use belayer_integration::episode::{Sandbox, is_contiguous};
use belayer_integration::registry::Registry;
use belayer_integration::{Containerd, leaks};
use belayer_registry::testing::{PASSWORD, Registry as AuthRegistry, USER};
use common::*;
use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;

/// What a CRI call answers.
type CriResult<T> = Result<containerd_client::tonic::Response<T>, containerd_client::tonic::Status>;

type Channel = containerd_client::tonic::transport::Channel;

/// A blocking CRI client (runtime and image services) of one containerd.
struct Cri {
    rt: tokio::runtime::Runtime,
    client: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
}

impl Cri {
    fn connect(c: &Containerd) -> Self {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let channel = rt
            .block_on(containerd_client::connect(&c.sock))
            .expect("connect to containerd");
        Self {
            rt,
            client: RuntimeServiceClient::new(channel.clone()),
            images: ImageServiceClient::new(channel),
        }
    }

    /// `call` on the runtime client, its error as the status message.
    fn call<T, F>(
        &mut self,
        call: impl FnOnce(RuntimeServiceClient<Channel>) -> F,
    ) -> Result<T, String>
    where
        F: std::future::Future<Output = CriResult<T>>,
    {
        let f = call(self.client.clone());
        self.wait(f)
    }

    /// `call` on the image client, its error as the status message.
    fn image_call<T, F>(
        &mut self,
        call: impl FnOnce(ImageServiceClient<Channel>) -> F,
    ) -> Result<T, String>
    where
        F: std::future::Future<Output = CriResult<T>>,
    {
        let f = call(self.images.clone());
        self.wait(f)
    }

    fn wait<T>(&self, f: impl std::future::Future<Output = CriResult<T>>) -> Result<T, String> {
        self.rt
            .block_on(f)
            .map(|r| r.into_inner())
            .map_err(|s| s.message().to_string())
    }

    /// CRI PullImage of `image` for pod `pod_name` with `auth` (the kubelet's credentials from
    /// an image pull secret); returns the image ref CRI reports.
    fn pull_image(
        &mut self,
        image: &str,
        pod_name: &str,
        auth: Option<cri::AuthConfig>,
    ) -> Result<String, String> {
        let req = cri::PullImageRequest {
            image: Some(cri::ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            auth,
            sandbox_config: Some(pod_config(pod_name)),
        };
        self.image_call(|mut c| async move { c.pull_image(req).await })
            .map(|r| r.image_ref)
    }

    /// Whether CRI knows image `image` (ImageStatus).
    fn has_image(&mut self, image: &str) -> bool {
        let req = cri::ImageStatusRequest {
            image: Some(cri::ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            verbose: false,
        };
        self.image_call(|mut c| async move { c.image_status(req).await })
            .expect("ImageStatus")
            .image
            .is_some()
    }

    /// Waits until CRI reports RuntimeReady: it answers "not initialized" for a moment after
    /// containerd comes up, as the kubelet sees it at node start. (NetworkReady stays false: no
    /// CNI.)
    fn wait_ready(&mut self) {
        let runtime_ready = |cri: &mut Cri| {
            cri.call(|mut c| async move { c.status(cri::StatusRequest { verbose: false }).await })
                .ok()
                .and_then(|s| s.status)
                .is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|k| k.r#type == "RuntimeReady" && k.status)
                })
        };
        assert!(
            wait_until(Duration::from_secs(30), || runtime_ready(self)),
            "CRI never reported RuntimeReady"
        );
    }

    /// RunPodSandbox of pod `name` on runtime handler `handler` ("": containerd's default,
    /// runc); returns its id.
    fn run_pod(&mut self, name: &str, handler: &str) -> String {
        let req = cri::RunPodSandboxRequest {
            config: Some(pod_config(name)),
            runtime_handler: handler.into(),
        };
        self.call(|mut c| async move { c.run_pod_sandbox(req).await })
            .unwrap_or_else(|e| panic!("RunPodSandbox {name} on handler {handler:?}: {e}"))
            .pod_sandbox_id
    }

    /// The kubelet's teardown of a pod: stop, then remove.
    fn remove_pod(&mut self, pod: &str) {
        let req = cri::StopPodSandboxRequest {
            pod_sandbox_id: pod.into(),
        };
        self.call(|mut c| async move { c.stop_pod_sandbox(req).await })
            .expect("StopPodSandbox");
        let req = cri::RemovePodSandboxRequest {
            pod_sandbox_id: pod.into(),
        };
        self.call(|mut c| async move { c.remove_pod_sandbox(req).await })
            .expect("RemovePodSandbox");
    }

    /// CRI CheckpointContainer of `id` into the archive `archive`, as the kubelet's checkpoint
    /// API does; the container keeps running.
    fn checkpoint(&mut self, id: &str, archive: &std::path::Path) {
        let req = cri::CheckpointContainerRequest {
            container_id: id.into(),
            location: archive.display().to_string(),
            timeout: 0,
        };
        self.call(|mut c| async move { c.checkpoint_container(req).await })
            .expect("CRI CheckpointContainer");
        assert_eq!(
            self.container_state(id),
            cri::ContainerState::ContainerRunning as i32,
            "not running after CRI's CheckpointContainer"
        );
    }

    /// CreateContainer and StartContainer in pod `pod` (named `pod_name`), as the kubelet does;
    /// returns the id.
    fn run_container(
        &mut self,
        pod: (&str, &str),
        name: &str,
        image: &str,
        command: &[&str],
    ) -> String {
        let image = cri::ImageSpec {
            image: image.into(),
            ..Default::default()
        };
        self.try_run_container(pod, name, image, command)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Cri::run_container`] of the image `image` (as the kubelet names it: with
    /// `user_specified_image`, the pod's image as written), its failure as the step and CRI's
    /// message.
    fn try_run_container(
        &mut self,
        (pod, pod_name): (&str, &str),
        name: &str,
        image: cri::ImageSpec,
        command: &[&str],
    ) -> Result<String, String> {
        let shown = image.image.clone();
        let req = cri::CreateContainerRequest {
            pod_sandbox_id: pod.into(),
            config: Some(cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata {
                    name: name.into(),
                    attempt: 0,
                }),
                image: Some(image),
                command: command.iter().map(|a| a.to_string()).collect(),
                linux: Some(cri::LinuxContainerConfig {
                    security_context: Some(cri::LinuxContainerSecurityContext {
                        namespace_options: Some(namespaces()),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            sandbox_config: Some(pod_config(pod_name)),
        };
        let id = self
            .call(|mut c| async move { c.create_container(req).await })
            .map_err(|e| format!("CreateContainer {name} from {shown}: {e}"))?
            .container_id;
        let req = cri::StartContainerRequest {
            container_id: id.clone(),
        };
        self.call(|mut c| async move { c.start_container(req).await })
            .map_err(|e| format!("StartContainer {name}: {e}"))?;
        Ok(id)
    }

    /// Kubernetes' restore: container `restored` created in `pod` from the checkpoint `image`
    /// (an archive's path, or a checkpoint image pulled already) and started; returns its id
    /// once CRI sees it running.
    fn restore_from(&mut self, pod: (&str, &str), image: &str) -> String {
        let id = self.run_container(pod, "restored", image, &[]);
        assert_eq!(
            self.container_state(&id),
            cri::ContainerState::ContainerRunning as i32,
            "the container restored from {image} does not run"
        );
        id
    }

    fn container_state(&mut self, id: &str) -> i32 {
        let req = cri::ContainerStatusRequest {
            container_id: id.into(),
            verbose: false,
        };
        let status = self
            .call(|mut c| async move { c.container_status(req).await })
            .expect("ContainerStatus");
        status.status.expect("a status").state
    }
}

/// Asserts that `s`'s counter file reads 1..N and grows: `what` restored it at one instant.
#[track_caller]
fn assert_counter_goes_on(s: &Sandbox, what: &str) {
    let counter = s.counter();
    assert!(
        is_contiguous(&counter)
            && wait_until(Duration::from_secs(5), || s.counter().len() > counter.len()),
        "{what} is not 1..N or does not go on: {:?}",
        &counter[counter.len().saturating_sub(8)..]
    );
}

/// Asserts that `s`'s counter, restored by `what` from a checkpoint taken once it had counted
/// `before`, has counted at least that much, and goes on as [`assert_counter_goes_on`] asks.
#[track_caller]
fn assert_counter_resumes(s: &Sandbox, before: usize, what: &str) {
    let counted = s.counter().len();
    assert!(
        counted >= before,
        "{what} ({counted}) is behind the checkpoint ({before})"
    );
    assert_counter_goes_on(s, what);
}

/// Asserts that the tar `archive` (`what`) holds what CRI's checkpoint archive holds (a Belayer
/// export as `checkpoint/`, `config.dump`, `spec.dump`) and the members `also`.
#[track_caller]
fn assert_holds(archive: &std::path::Path, also: &[&str], what: &str) {
    let listing = std::process::Command::new("tar")
        .arg("--list")
        .arg("--file")
        .arg(archive)
        .output()
        .expect("run tar");
    let listing = String::from_utf8_lossy(&listing.stdout);
    let cri = [
        "checkpoint/belayer-chain.tar",
        "checkpoint/inventory.img",
        "config.dump",
        "spec.dump",
    ];
    for entry in cri.iter().chain(also) {
        assert!(
            listing
                .lines()
                .any(|l| l.trim_start_matches("./") == *entry),
            "{entry} is not in {what}:\n{listing}"
        );
    }
}

/// Asserts that `c`'s shims go once its pods went (within 10 s).
#[track_caller]
fn assert_no_shims(c: &Containerd) {
    assert!(
        wait_until(Duration::from_secs(10), || c.shim_pids().is_empty()),
        "shims left after the pods went: {:?}",
        c.shim_pids()
    );
}

/// Pod-level Linux settings as the kubelet sends them for a host-network pod.
fn namespaces() -> cri::NamespaceOption {
    cri::NamespaceOption {
        network: cri::NamespaceMode::Node as i32,
        pid: cri::NamespaceMode::Container as i32,
        ipc: cri::NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

fn pod_config(name: &str) -> cri::PodSandboxConfig {
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.into(),
            uid: format!("belayer-it-{name}-uid"),
            namespace: "default".into(),
            attempt: 0,
        }),
        linux: Some(cri::LinuxPodSandboxConfig {
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(namespaces()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// busybox named after a registry on loopback that serves containerd's own content store, and
/// that registry: CRI's restore from a checkpoint archive pulls the checkpoint's base image by
/// digest, and there is no registry on these machines.
/// Returns the registry, the image by tag and by digest.
fn served_busybox(c: &Containerd) -> (Registry, String, String) {
    let registry = Registry::serve(&c.content_dir());
    let image = format!("{}/busybox:latest", registry.host);
    c.ctr(&["images", "tag", "belayer.local/busybox:latest", &image])
        .ok();
    // As after a pull, the image is known by its digest too: CRI reports that reference as the
    // container's image (and the checkpoint's base image).
    let listed = c.ctr(&["images", "ls"]).ok().stdout;
    let digest = listed
        .lines()
        .find(|l| l.starts_with(&image))
        .and_then(|l| l.split_whitespace().find(|w| w.starts_with("sha256:")))
        .unwrap_or_else(|| panic!("no digest of {image} in `ctr images ls`:\n{listed}"))
        .to_string();
    let by_digest = format!("{}/busybox@{digest}", registry.host);
    c.ctr(&["images", "tag", &image, &by_digest]).ok();
    (registry, image, by_digest)
}

/// A CRI client of `c`, pod `pod_name` on the Belayer handler and the registry serving its
/// busybox, and the id of container `sandbox` running the counter loop in it.
fn counter_pod(c: &Containerd, pod_name: &str) -> (Cri, String, Registry, String) {
    let mut cri = Cri::connect(c);
    cri.wait_ready();
    let pod = cri.run_pod(pod_name, "belayer");
    let (registry, image, _) = served_busybox(c);
    let id = cri.run_container(
        (&pod, pod_name),
        "sandbox",
        &image,
        &["sh", "-c", COUNTER_LOOP],
    );
    (cri, pod, registry, id)
}

#[test]
fn a_cri_pod_on_the_belayer_handler_checkpoints_and_restores() {
    let c = Containerd::start_cri();
    let (mut cri, pod, registry, id) = counter_pod(&c, "agent-pod");
    assert_eq!(
        cri.container_state(&id),
        cri::ContainerState::ContainerRunning as i32
    );

    // The pod's sandbox and its container run under one Belayer shim.
    let shims: Vec<u32> = c.shim_pids();
    assert_eq!(shims.len(), 1, "one shim for the pod, got {shims:?}");
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", shims[0])).unwrap_or_default();
    assert!(
        String::from_utf8_lossy(&cmdline).contains("containerd-shim-belayer-v1"),
        "the pod's shim is not Belayer's: {}",
        String::from_utf8_lossy(&cmdline)
    );

    let s = Sandbox::attach(&c, &id);
    assert_eq!(s.exec("echo kept > /kept", None).code, 0);
    let cp = c
        .belayer(&["checkpoint", &id])
        .ok()
        .stdout
        .trim()
        .to_string();
    assert_eq!(s.exec("rm /kept && echo later > /later", None).code, 0);
    c.belayer(&["restore", &id, "--checkpoint", &cp]).ok();
    assert_eq!(
        cri.container_state(&id),
        cri::ContainerState::ContainerRunning as i32,
        "CRI lost the restored container"
    );
    assert_eq!(
        s.exec("cat /kept; test -e /later || echo no-later", None)
            .stdout,
        "kept\nno-later\n"
    );
    assert_counter_goes_on(&s, "the restored counter");

    // Kubernetes' own checkpoint (the kubelet's checkpoint API → CRI CheckpointContainer): an
    // archive holding a Belayer full checkpoint, the container still running.
    assert_eq!(s.exec("echo by-cri > /by-cri", None).code, 0);
    let archive = c.dir.join("cri-checkpoint.tar");
    cri.checkpoint(&id, &archive);
    assert_holds(&archive, &[], "CRI's checkpoint archive");
    assert_eq!(
        s.exec("rm /by-cri && echo after-cri > /after-cri", None)
            .code,
        0
    );

    // Kubernetes' restore: a container created from the archive (its path as the image), as on
    // another node, whose store has none of the source's checkpoints: the archive brings them.
    std::fs::remove_dir_all(c.checkpoints_dir(&id))
        .expect("remove the source's checkpoints from the store");
    let restored = cri.restore_from((&pod, "agent-pod"), &archive.display().to_string());
    assert!(
        registry
            .requests()
            .iter()
            .any(|r| r.contains("/manifests/sha256:") && r.ends_with(" 200 OK")),
        "CRI did not pull the base image from the test's registry: {:?}",
        registry.requests()
    );
    // containerd also unpacks its own diff of the source's snapshot into the new container's
    // rootfs before it starts. That diff is stale here: since Belayer's restore above, the
    // source runs on Belayer's layers, and its snapshot still holds /later and the counter file
    // of before that restore. Neither may reach the restored container.
    let r = Sandbox::attach(&c, &restored);
    assert_eq!(
        r.exec(
            "cat /kept /by-cri; for f in /later /after-cri; do test -e $f || echo no$f; done",
            None
        )
        .stdout,
        "kept\nby-cri\nno/later\nno/after-cri\n",
        "the container restored by CRI is not at the checkpoint"
    );
    assert_counter_goes_on(&r, "the counter restored by CRI");

    // The kubelet's teardown: stop and remove the pod. Nothing of it is left.
    cri.remove_pod(&pod);
    assert_no_shims(&c);
    let mounts: Vec<String> = leaks::mounts_under(&c.dir)
        .into_iter()
        .filter(|m| m.contains(&pod) || m.contains(&id) || m.contains(&restored))
        .collect();
    assert!(mounts.is_empty(), "mounts of the pod left: {mounts:?}");
    let _ = c.belayer(&["rm", &id, &cp]);
}

/// Kubernetes' checkpoint of a container on runc (CRI's default handler) restores into a pod on
/// the Belayer handler: as runc would (its processes from the archive's CRIU images, its
/// filesystem from containerd's diff, `rootfs-diff.tar`), after which Belayer checkpoints and
/// restores it as any other container.
#[test]
fn a_runc_made_cri_checkpoint_restores_on_the_belayer_handler() {
    let c = Containerd::start_cri();
    let mut cri = Cri::connect(&c);
    cri.wait_ready();
    let (_registry, image, _) = served_busybox(&c);
    let runc_pod = cri.run_pod("runc-pod", "");
    let id = cri.run_container(
        (&runc_pod, "runc-pod"),
        "on-runc",
        &image,
        &["sh", "-c", COUNTER_LOOP],
    );
    let s = Sandbox::attach(&c, &id);
    assert_eq!(s.exec("echo kept > /kept && rm /bin/true", None).code, 0);
    let archive = c.dir.join("runc-checkpoint.tar");
    cri.checkpoint(&id, &archive);
    assert_eq!(s.exec("echo later > /later", None).code, 0);

    let pod = cri.run_pod("belayer-pod", "belayer");
    let restored = cri.restore_from((&pod, "belayer-pod"), &archive.display().to_string());
    let r = Sandbox::attach(&c, &restored);
    assert_eq!(
        r.exec(
            "cat /kept; test -e /bin/true || echo no-true; test -e /later || echo no-later",
            None
        )
        .stdout,
        "kept\nno-true\nno-later\n",
        "the container restored from runc's archive is not at its checkpoint"
    );
    assert_counter_goes_on(&r, "the counter restored from runc's archive");

    let log = std::fs::read_to_string(c.log_path()).unwrap_or_default();
    assert!(
        log.contains(&format!(
            "container {restored} restored from runc's CRIU images"
        )),
        "the shim did not restore runc's images"
    );

    // From here on it is a Belayer container: a full checkpoint, then a restore in place.
    let cp = c
        .belayer(&["checkpoint", &restored])
        .ok()
        .stdout
        .trim()
        .to_string();
    assert_eq!(r.exec("rm /kept", None).code, 0);
    c.belayer(&["restore", &restored, "--checkpoint", &cp]).ok();
    assert_eq!(r.exec("cat /kept", None).stdout, "kept\n");
    assert_counter_goes_on(&r, "the counter after Belayer's restore");

    cri.remove_pod(&pod);
    cri.remove_pod(&runc_pod);
    assert_no_shims(&c);
    let _ = c.belayer(&["rm", &restored, &cp]);
}

/// The manifest of checkpoint image `pinned` in `registry`, asserting what `checkpointctl build`
/// would give it for the `sandbox` container of pod `pod_name` on Belayer's runtime, from the
/// busybox that `busybox` serves named `image_name`: checkpointctl's annotations and one
/// uncompressed layer.
#[track_caller]
fn checked_checkpoint_image(
    registry: &AuthRegistry,
    pinned: &str,
    pod_name: &str,
    busybox: &Registry,
    image_name: &str,
) -> serde_json::Value {
    let digest = pinned.rsplit_once('@').map(|(_, d)| d).unwrap_or_default();
    let digest = belayer_registry::Digest::parse(digest).expect("a pinned digest");
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(registry.blob_file(&digest)).unwrap()).unwrap();
    let busybox = format!("{}/busybox", busybox.host);
    let a = &manifest["annotations"];
    for (key, want) in [
        ("org.criu.checkpoint.engine.name", "containerd"),
        ("org.criu.checkpoint.container.name", "sandbox"),
        ("org.criu.checkpoint.pod.name", pod_name),
        ("org.criu.checkpoint.pod.namespace", "default"),
        (
            "org.criu.checkpoint.runtime.name",
            "io.containerd.belayer.v1",
        ),
        ("org.criu.checkpoint.rootfsImageName", image_name),
    ] {
        assert_eq!(a[key], want, "{key} in {manifest}");
    }
    let image_id = a["org.criu.checkpoint.rootfsImageID"]
        .as_str()
        .unwrap_or_default();
    assert!(
        image_id.starts_with(&format!("{busybox}@sha256:")),
        "rootfsImageID {image_id:?}"
    );
    assert_eq!(
        manifest["layers"][0]["mediaType"],
        "application/vnd.oci.image.layer.v1.tar"
    );
    manifest
}

/// Asserts that `belayer push ARGS` (credentials from the docker config dir `docker`) is refused
/// as invalid (exit 8) saying `says`, and that nothing reached `registry`.
#[track_caller]
fn assert_push_refused(
    c: &Containerd,
    registry: &AuthRegistry,
    docker: &std::path::Path,
    args: &[&str],
    says: &str,
) {
    let uploads = registry.finished_uploads();
    let refused = c.belayer_docker(docker, &[&["push"], args].concat());
    assert_eq!(
        refused.code, 8,
        "push {args:?} was not refused: {refused:?}"
    );
    assert!(refused.stderr.contains(says), "{}", refused.stderr);
    assert_eq!(
        registry.finished_uploads(),
        uploads,
        "the refused push uploaded"
    );
}

/// Kubernetes' restore from checkpoint image `pinned` in `pod` (id, name): the kubelet pulls it
/// with the pod's pull secret (CRI PullImage `auth`), then creates the container from it, which
/// containerd takes as a checkpoint image. Asserts that the container is at the checkpoint: the
/// file `kept` (written before it) is there and `/after` (written after it) is not. Returns the
/// restored container's id.
#[track_caller]
fn restore_pulled(
    c: &Containerd,
    cri: &mut Cri,
    pod: (&str, &str),
    pinned: &str,
    kept: &str,
) -> String {
    cri.pull_image(
        pinned,
        pod.1,
        Some(cri::AuthConfig {
            username: USER.into(),
            password: PASSWORD.into(),
            ..Default::default()
        }),
    )
    .unwrap_or_else(|e| panic!("CRI PullImage {pinned}: {e}"));
    let restored = cri.restore_from(pod, pinned);
    let log = std::fs::read_to_string(c.log_path()).unwrap_or_default();
    assert!(
        log.contains("Found checkpoint of container"),
        "containerd did not take {pinned} as a checkpoint image"
    );
    let script = format!("cat {kept}; test -e /after || echo no-after");
    assert_eq!(
        Sandbox::attach(c, &restored).exec(&script, None).stdout,
        format!("{}\nno-after\n", kept.trim_start_matches('/')),
        "the container restored from {pinned} is not at its checkpoint"
    );
    restored
}

/// Kubernetes' checkpoint leaves the node as a checkpoint image (KEP-2008's way: `checkpointctl
/// build`): CRI CheckpointContainer writes the archive, `belayer push --cri-archive` pushes it to
/// a registry with authentication (the CLI's credentials from a docker config), the pod goes
/// and with it every local trace of the checkpoint (archive, Belayer store); a new pod pulls the
/// image by digest with the kubelet's credentials (CRI PullImage `auth`), and a container
/// created from it (containerd's `checkIfCheckpointOCIImage`) continues from the checkpoint,
/// processes and filesystem. A hostile archive is refused by the push, naming its member.
#[test]
fn a_cri_checkpoint_pushed_as_an_image_restores_in_another_pod() {
    let c = Containerd::start_cri();
    let (mut cri, pod, busybox, id) = counter_pod(&c, "image-pod");
    let s = Sandbox::attach(&c, &id);
    assert_eq!(s.exec("echo by-cri > /by-cri", None).code, 0);
    let archive = c.dir.join("cri-checkpoint.tar");
    cri.checkpoint(&id, &archive);
    assert_eq!(s.exec("rm /by-cri && echo after > /after", None).code, 0);

    let registry = AuthRegistry::start();
    let docker = c.dir.join("docker-config");
    registry.write_docker_config(&docker, USER, PASSWORD);
    let push = |args: &[&str]| {
        let mut cmd = c.belayer_cmd(args);
        cmd.env("DOCKER_CONFIG", &docker);
        belayer_integration::containerd::run(&mut cmd, None, Duration::from_secs(300))
    };
    let reference = format!("{}/k8s/agent:cp", registry.addr);
    let archive_arg = archive.display().to_string();
    let out = push(&["push", "--cri-archive", &archive_arg, &reference]).ok();
    let pinned = out.stdout.lines().next().unwrap_or_default().to_string();
    assert!(
        pinned.starts_with(&format!("{reference}@sha256:")),
        "push printed {:?}",
        out.stdout
    );

    // The manifest carries checkpointctl's annotations, filled from containerd's own dumps.
    let tag = format!("{}/busybox:latest", busybox.host);
    checked_checkpoint_image(&registry, &pinned, "image-pod", &busybox, &tag);

    // A hostile archive: a symlink in it (to a host file) is refused, naming it; nothing goes up.
    let hostile = c.dir.join("hostile.tar");
    std::fs::copy(&archive, &hostile).unwrap();
    let links = c.dir.join("links");
    std::fs::create_dir_all(links.join("checkpoint")).unwrap();
    std::os::unix::fs::symlink("/etc/shadow", links.join("checkpoint/pages-9.img")).unwrap();
    tar(&[
        "--append",
        "--file",
        &hostile.display().to_string(),
        "--directory",
        &links.display().to_string(),
        "checkpoint/pages-9.img",
    ]);
    let hostile_arg = hostile.display().to_string();
    let hostile_ref = format!("{}/k8s/agent:hostile", registry.addr);
    assert_push_refused(
        &c,
        &registry,
        &docker,
        &["--cri-archive", &hostile_arg, &hostile_ref],
        r#"member "checkpoint/pages-9.img" is of tar type '2'"#,
    );

    // The source goes, and every local trace of its checkpoint: as on another node.
    cri.remove_pod(&pod);
    std::fs::remove_file(&archive).unwrap();
    let _ = std::fs::remove_dir_all(c.checkpoints_dir(&id));
    assert!(!cri.has_image(&pinned), "{pinned} is local before the pull");

    // The new pod: the kubelet pulls the checkpoint image with the pod's pull secret, then
    // creates the container from it.
    let pod = cri.run_pod("image-pod-2", "belayer");
    let e = cri
        .pull_image(&pinned, "image-pod-2", None)
        .expect_err("pulled without credentials");
    assert!(e.contains("no basic auth credentials"), "{e}");
    let restored = restore_pulled(&c, &mut cri, (&pod, "image-pod-2"), &pinned, "/by-cri");
    let r = Sandbox::attach(&c, &restored);
    assert_counter_goes_on(&r, "the counter restored from the checkpoint image");

    cri.remove_pod(&pod);
    assert_no_shims(&c);
}

/// A checkpoint Belayer took itself (`belayer checkpoint` of a pod's container, on the Belayer
/// handler) leaves the node as a Kubernetes checkpoint image: `belayer push --kube` packs the
/// shim's export of it with the dumps CRI writes beside a checkpoint, made from containerd's own
/// records of the container, and pushes it to a registry with authentication. The image is of
/// the checkpoint named (not of the container at the push), whose instant its config carries. The
/// pod goes, and its checkpoints; on node B (a second containerd with its own root, content
/// store and Belayer store) a new pod pulls the image by digest with the kubelet's credentials,
/// and a container created from it through CRI continues from that checkpoint, processes and
/// filesystem, its chain imported into node B's store. Fails on the old code: no `--kube`.
#[test]
fn a_belayer_checkpoint_pushed_as_a_kubernetes_image_restores_on_another_node() {
    let started = std::time::Instant::now();
    let c = Containerd::start_cri();
    let (mut cri, pod, busybox, id) = counter_pod(&c, "kube-pod");
    let s = Sandbox::attach(&c, &id);
    assert_eq!(s.exec("echo by-belayer > /by-belayer", None).code, 0);
    let before = s.counter().len();
    let cp = checkpoint(&c, &id);
    let at_checkpoint = s.counter().len();
    assert_eq!(
        s.exec("rm /by-belayer && echo after > /after", None).code,
        0
    );
    // The source runs on well past the checkpoint before the push.
    assert!(wait_until(Duration::from_secs(10), || s.counter().len()
        > at_checkpoint + 200));

    let registry = AuthRegistry::start();
    let docker = c.dir.join("docker-config");
    registry.write_docker_config(&docker, USER, PASSWORD);
    let reference = format!("{}/k8s/agent:belayer-{cp}", registry.addr);
    let out = c
        .belayer_docker(&docker, &["push", "--kube", &id, &cp, &reference, "--json"])
        .ok();
    let info: serde_json::Value = serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("push --json printed {:?}: {e}", out.stdout));
    assert_eq!(info["checkpoint"], cp.as_str(), "{info}");
    let pinned = info["reference"].as_str().unwrap_or_default().to_string();
    assert!(
        pinned.starts_with(&format!("{reference}@sha256:")),
        "{info}"
    );

    // An image as `checkpointctl build` makes of CRI's archive: checkpointctl's annotations
    // from containerd's records, one layer holding the export as checkpoint/ and the dumps,
    // created at the checkpoint's instant.
    let tag = format!("{}/busybox:latest", busybox.host);
    let manifest = checked_checkpoint_image(&registry, &pinned, "kube-pod", &busybox, &tag);
    let blob = |digest: &serde_json::Value| {
        let digest =
            belayer_registry::Digest::parse(digest.as_str().unwrap_or_default()).expect("a digest");
        std::fs::read(registry.blob_file(&digest)).unwrap()
    };
    let inspected: serde_json::Value =
        serde_json::from_str(&c.belayer(&["inspect", &id, &cp]).ok().stdout).unwrap();
    let instant = inspected["created_unix_ms"]
        .as_u64()
        .expect("created_unix_ms");
    let config: serde_json::Value =
        serde_json::from_slice(&blob(&manifest["config"]["digest"])).unwrap();
    assert_eq!(
        config["created"],
        belayer_registry::kube::rfc3339(i128::from(instant) * 1_000_000)
    );
    let layer = c.dir.join("kube-layer.tar");
    std::fs::write(&layer, blob(&manifest["layers"][0]["digest"])).unwrap();
    assert_holds(&layer, &["status.dump"], "the image's layer");
    let _ = std::fs::remove_file(&layer);

    // A container CRI does not serve (made with ctr, on Belayer's runtime) is no Kubernetes one:
    // refused by name before anything is exported or uploaded.
    run_detached(&c, BELAYER, "plain", &["sleep", "1000"]);
    checkpoint(&c, "plain");
    let plain = format!("{}/k8s/plain:x", registry.addr);
    assert_push_refused(
        &c,
        &registry,
        &docker,
        &["--kube", "plain", &plain],
        "container plain is not a Kubernetes (CRI) container",
    );
    remove(&c, "plain");

    // The source goes, and its checkpoints with it.
    cri.remove_pod(&pod);
    let _ = std::fs::remove_dir_all(c.checkpoints_dir(&id));
    assert_no_shims(&c);

    // Node B: a containerd of its own (root, content, Belayer store), CRI on the Belayer handler.
    let b = Containerd::start_cri();
    let mut cri_b = Cri::connect(&b);
    cri_b.wait_ready();
    assert!(
        !cri_b.has_image(&pinned),
        "{pinned} is on node B before the pull"
    );
    let pod = cri_b.run_pod("kube-pod-2", "belayer");
    let restored = restore_pulled(&b, &mut cri_b, (&pod, "kube-pod-2"), &pinned, "/by-belayer");
    let r = Sandbox::attach(&b, &restored);
    assert_counter_resumes(
        &r,
        before,
        "the counter restored from Belayer's checkpoint image",
    );
    assert!(
        std::fs::read_dir(b.checkpoints_dir(&restored)).is_ok_and(|mut d| d.next().is_some()),
        "node B's store holds no checkpoint of the restored container"
    );

    cri_b.remove_pod(&pod);
    assert_no_shims(&b);
    eprintln!(
        "push --kube: {} bytes up, restored on node B; test took {:.1} s",
        info["uploaded_bytes"],
        started.elapsed().as_secs_f64()
    );
}

/// Automatic replication carries a pod's container through a node loss as a Kubernetes
/// checkpoint image (issue 25): node A's Belayer config checkpoints automatically and replicates
/// to a registry with authentication. The pod's container (its image named by digest, as the
/// kubelet hands the pod's image to CRI) takes automatic checkpoints after its actions, and each
/// goes up in the background as Belayer's artifact and, from the same export, as the checkpoint
/// image `REPO:<container>-<checkpoint>-kube` (`REPO:<container>-kube` and
/// `REPO:<namespace>_<pod>_<container>-kube` moved to it), its dumps made by the shim from the
/// container's own spec; `belayer status` reports it. Node A is then killed whole (containerd,
/// its shims, the pod's processes) and its store moved out of reach; only the registries are
/// left (the base image's, here served from node A's content store files, stands for the
/// cluster's). On node B a pod pulls `REPO:default_auto-pod_sandbox-kube` (no id of node A's
/// needed) with the kubelet's credentials, and a container created from it through CRI continues from the newest
/// replicated checkpoint: the files of every turn, the counter from where it was. Fails on the
/// old code: replication pushed no image.
#[test]
fn automatic_replication_restores_a_pods_container_on_another_node_after_a_node_loss() {
    let started = std::time::Instant::now();
    let registry = AuthRegistry::start();
    let scratch = belayer_integration::Scratch::new("kube-auto");
    let docker = scratch.path().join("docker");
    registry.write_docker_config(&docker, USER, PASSWORD);
    let repo = format!("{}/k8s/auto", registry.addr);
    let config = scratch.path().join("belayer.toml");
    std::fs::write(
        &config,
        format!(
            "checkpoint = \"auto\"\n[replication]\nrepository = \"{repo}\"\n\
             docker_config = \"{}\"\n",
            docker.join("config.json").display()
        ),
    )
    .unwrap();
    let a = Containerd::start_cri_configured(Some(config));
    let mut cri = Cri::connect(&a);
    cri.wait_ready();
    let pod = cri.run_pod("auto-pod", "belayer");
    let (busybox, _, by_digest) = served_busybox(&a);
    let image = cri::ImageSpec {
        image: by_digest.clone(),
        user_specified_image: by_digest.clone(),
        ..Default::default()
    };
    let id = cri
        .try_run_container(
            (&pod, "auto-pod"),
            "sandbox",
            image,
            &["sh", "-c", COUNTER_LOOP],
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let s = Sandbox::attach(&a, &id);
    let listed = || -> Vec<String> {
        a.belayer(&["checkpoints", &id])
            .stdout
            .lines()
            .map(str::to_string)
            .collect()
    };
    // Two turns, each an action then the model thinking while the scheduler checkpoints.
    let (mut newest, mut before) = (String::new(), 0);
    for n in 1..=2 {
        assert_eq!(s.exec(&format!("echo turn{n} > /turn{n}"), None).code, 0);
        before = s.counter().len();
        a.belayer(&["hint", &id, "llm-start", "--expected-ms", "2000"])
            .ok();
        assert!(
            wait_until(Duration::from_secs(20), || listed()
                .last()
                .is_some_and(|l| *l != newest)),
            "turn {n}: no automatic checkpoint; shim log:\n{}",
            a.log_lines(&id, 20)
        );
        newest = listed().last().unwrap().clone();
    }
    // Both forms of the newest replicated in the background.
    let replication = || status(&a, &id)["replication"].clone();
    assert!(
        wait_until(Duration::from_secs(90), || {
            let r = replication();
            r["kube_checkpoint"].is_string()
                && r["kube_checkpoint"] == r["newest"]
                && r["behind"].as_array().is_some_and(|b| b.is_empty())
        }),
        "replication did not push the newest checkpoint as an image: {}; shim log:\n{}",
        replication(),
        a.log_lines(&id, 30)
    );
    let r = replication();
    eprintln!("kube-auto: node A's status once replicated: {r}");
    assert_eq!(r["failures"], 0, "{r}");
    assert_eq!(r["kube_failures"], 0, "{r}");
    assert!(r["kube_last_error"].is_null(), "{r}");
    let cp = r["kube_checkpoint"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(cp.parse::<u64>().ok() >= newest.parse::<u64>().ok(), "{r}");
    let pinned = r["kube_reference"].as_str().unwrap_or_default().to_string();
    assert!(
        pinned.starts_with(&format!("{repo}:{id}-{cp}-kube@sha256:")),
        "{r}"
    );
    // checkpointctl's annotations, from the container's own spec: the base image as CRI named
    // it to the runtime, here by digest.
    checked_checkpoint_image(&registry, &pinned, "auto-pod", &busybox, &by_digest);

    let lost = kill_node_in(&a, "k8s.io", &[&pod, &id]);

    // Node B: its own containerd, content and Belayer store; only the registries reach it.
    let b = Containerd::start_cri();
    let mut cri_b = Cri::connect(&b);
    cri_b.wait_ready();
    let pod_b = cri_b.run_pod("auto-pod-2", "belayer");
    // By the names the user knows (namespace, pod, container), not node A's container id.
    let newest_image = format!("{repo}:default_auto-pod_sandbox-kube");
    let restored = restore_pulled(
        &b,
        &mut cri_b,
        (&pod_b, "auto-pod-2"),
        &newest_image,
        "/turn2",
    );
    let r = Sandbox::attach(&b, &restored);
    assert_eq!(
        r.exec("cat /turn1", None).stdout,
        "turn1\n",
        "turn 1's file did not come"
    );
    assert_counter_resumes(&r, before, "the counter restored from the replicated image");
    // The same image under node A's container id.
    let auth = || {
        Some(cri::AuthConfig {
            username: USER.into(),
            password: PASSWORD.into(),
            ..Default::default()
        })
    };
    let by_id = format!("{repo}:{id}-kube");
    assert_eq!(
        cri_b.pull_image(&by_id, "auto-pod-2", auth()),
        cri_b.pull_image(&newest_image, "auto-pod-2", auth()),
        "{by_id} and {newest_image} are not one image"
    );
    assert!(
        busybox
            .requests()
            .iter()
            .any(|q| q.contains("/manifests/sha256:")),
        "node B did not pull the base image by digest: {:?}",
        busybox.requests()
    );

    cri_b.remove_pod(&pod_b);
    assert_no_shims(&b);
    let _ = std::fs::remove_dir_all(&lost);
    eprintln!(
        "kube-auto: restored on node B from {newest_image} (checkpoint {cp}); test took {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// Runs `tar` with `args`, panicking with its stderr on failure.
/// A copy of the CRI checkpoint archive `archive` whose Belayer chain has every manifest edited
/// by `edit`: what an archive's author can write.
fn forge(archive: &std::path::Path, name: &str, edit: &dyn Fn(&mut serde_json::Value)) -> PathBuf {
    let base = archive.with_file_name(format!("forge-{name}"));
    let (outer, inner) = (base.join("archive"), base.join("chain"));
    std::fs::create_dir_all(&outer).unwrap();
    std::fs::create_dir_all(&inner).unwrap();
    let s = |p: &std::path::Path| p.display().to_string();
    const KEEP: [&str; 4] = [
        "--xattrs",
        "--xattrs-include=*",
        "--numeric-owner",
        "--sparse",
    ];
    tar(&[
        "--extract",
        "--file",
        &s(archive),
        "--directory",
        &s(&outer),
    ]);
    let chain = outer.join("checkpoint/belayer-chain.tar");
    let mut args = vec!["--extract", "--same-owner", "--preserve-permissions"];
    args.extend(KEEP);
    let (chain_s, inner_s) = (s(&chain), s(&inner));
    args.extend(["--file", &chain_s, "--directory", &inner_s]);
    tar(&args);
    let mut edited = 0;
    let mut stack = vec![inner.clone()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            } else if e.file_name() == "manifest.json" {
                let mut m: serde_json::Value =
                    serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
                edit(&mut m);
                // The format version stays the first key, as readers check it first.
                let version = m["format_version"].take();
                m.as_object_mut().unwrap().remove("format_version");
                let rest = serde_json::to_string(&m).unwrap();
                let text = format!("{{\"format_version\":{version},{}", &rest[1..]);
                std::fs::write(&p, text).unwrap();
                edited += 1;
            }
        }
    }
    assert!(edited > 0, "no manifest in {}", chain.display());
    let mut args = vec!["--create", "--format=posix"];
    args.extend(KEEP);
    args.extend(["--file", &chain_s, "--directory", &inner_s, "checkpoints"]);
    tar(&args);
    let forged = base.with_extension("tar");
    tar(&[
        "--create",
        "--file",
        &s(&forged),
        "--directory",
        &s(&outer),
        ".",
    ]);
    forged
}

/// Kubernetes' restore of forged checkpoint archives (a real CRI archive whose Belayer chain was
/// edited), through CRI and the shim's import: a manifest whose `criu_dir` is absolute (a
/// stand-in for /etc/cron.d) is refused and nothing is written there; one whose image lower dirs
/// name a host dir restores on the new container's own image snapshot, and the host dir's files
/// never show in it. Both fail on the old code.
#[test]
fn forged_cri_archives_reach_nothing_outside_their_checkpoint() {
    let c = Containerd::start_cri();
    let (mut cri, pod, _registry, id) = counter_pod(&c, "forged-pod");
    let archive = c.dir.join("cri-checkpoint.tar");
    cri.checkpoint(&id, &archive);
    // As on another node: the archive brings the checkpoints.
    std::fs::remove_dir_all(c.checkpoints_dir(&id)).expect("remove the source's checkpoints");

    let cron = c.dir.join("cron.d");
    let path = cron.display().to_string();
    let forged = forge(&archive, "criu-dir", &|m| {
        m["criu_dir"] = path.clone().into()
    });
    let e = cri
        .try_run_container(
            (&pod, "forged-pod"),
            "forged",
            cri::ImageSpec {
                image: forged.display().to_string(),
                ..Default::default()
            },
            &[],
        )
        .expect_err("a checkpoint with an absolute criu_dir was restored");
    assert!(!cron.exists(), "the import wrote outside the store ({e})");
    assert!(e.contains("criu_dir") && e.contains("is absolute"), "{e}");

    let host = c.dir.join("host-dir");
    std::fs::create_dir_all(&host).unwrap();
    std::fs::write(host.join("from-host"), "secret").unwrap();
    let lowers = serde_json::json!([host.display().to_string()]);
    let forged = forge(&archive, "lowers", &|m| m["image_lowers"] = lowers.clone());
    let restored = cri.restore_from((&pod, "forged-pod"), &forged.display().to_string());
    let r = Sandbox::attach(&c, &restored);
    assert_eq!(
        r.exec(
            "test -e /from-host && echo host || echo image; test -x /bin/busybox && echo ok",
            None
        )
        .stdout,
        "image\nok\n",
        "the restored container does not stand on its own image"
    );
    assert_counter_goes_on(&r, "the counter restored from the forged archive");
    cri.remove_pod(&pod);
}
