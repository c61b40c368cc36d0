//! One file per verb: each maps its arguments onto the control API, the store or containerd.

mod checkpoint;
mod checkpoints;
mod fork;
mod gateway;
mod hint;
mod inspect;
mod journal;
mod pull;
mod push;
mod restore;
mod rm;
mod status;

use belayer_api::Settings;
use criu_bridge::Store;

use crate::containerd::Containerd;
use crate::control::Control;
use crate::error::{Error, Result};
use crate::{Cli, Command};

/// What every verb may use: the namespace, containerd, the node's store and the namespace's
/// action journals.
pub struct Context {
    pub namespace: String,
    pub containerd: Containerd,
    pub store: Store,
    pub journals: std::path::PathBuf,
}

impl Context {
    /// The control socket of `container`'s shim (which may not exist).
    pub fn control(&self, container: &str) -> Control {
        Control::new(&self.namespace, container)
    }

    /// The control socket of `container`'s shim, or why there is none.
    pub fn require_control(&self, container: &str) -> Result<Control> {
        self.control(container).require(&self.containerd)
    }

    /// The container's checkpoint ids, oldest first; "not found" when it has none and containerd
    /// does not know it.
    pub fn list(&self, container: &str) -> Result<Vec<u64>> {
        let seqs = self.store.list(&self.namespace, container)?;
        if seqs.is_empty() {
            self.containerd.container(container)?;
        }
        Ok(seqs)
    }

    /// Checkpoint `seq`, or the container's newest when `None`; "no checkpoints" when it has none.
    pub fn checkpoint_or_newest(&self, container: &str, seq: Option<u64>) -> Result<u64> {
        match seq {
            Some(seq) => Ok(seq),
            None => self
                .list(container)?
                .last()
                .copied()
                .ok_or_else(|| Error::NoCheckpoints(container.to_string())),
        }
    }

    /// A store error; a missing checkpoint of a container containerd does not know either is
    /// "container not found". Any other refusal is the store's own (a removed container's
    /// checkpoints stay, and a fork stacking on one keeps it: "in use by …", not "not found" —
    /// the chaos soak's race-fork saw the latter for a removed fork's checkpoint).
    pub fn not_found_or(&self, container: &str, e: criu_bridge::store::StoreError) -> Error {
        if matches!(e, criu_bridge::store::StoreError::NotFound { .. })
            && let Err(missing) = self.containerd.container(container)
        {
            return missing;
        }
        e.into()
    }
}

/// Exits as clap does on a bad command line (exit code 2), saying `why`.
fn usage(why: &str) -> ! {
    use clap::CommandFactory;
    Cli::command()
        .error(clap::error::ErrorKind::WrongNumberOfValues, why)
        .exit()
}

/// Runs the command line.
pub fn run(cli: Cli) -> Result<()> {
    let settings = Settings::load()?;
    let cx = Context {
        containerd: Containerd::new(&cli.address, &cli.namespace),
        journals: settings.journals(&cli.namespace),
        namespace: cli.namespace,
        store: settings.store(),
    };
    match cli.command {
        Command::Checkpoint { container, exit } => checkpoint::run(&cx, &container, exit),
        Command::Checkpoints { container } => checkpoints::run(&cx, &container),
        Command::Inspect {
            container,
            checkpoint,
        } => inspect::run(&cx, &container, &checkpoint),
        Command::Restore {
            container,
            checkpoint,
            json,
        } => restore::run(&cx, &container, checkpoint.as_deref(), json),
        Command::Fork {
            container,
            checkpoint,
            count,
        } => fork::run(&cx, &container, &checkpoint, count),
        Command::Rm {
            container,
            checkpoint,
        } => rm::run(&cx, &container, &checkpoint),
        Command::Hint {
            container,
            hint,
            expected_ms,
            expected_tokens,
        } => hint::run(
            &cx,
            &container,
            belayer_api::HintRequest {
                hint,
                expected_ms,
                expected_tokens,
            },
        ),
        Command::Status { container } => status::run(&cx, &container),
        Command::Push {
            args,
            kube,
            cri_archive,
            plain_http,
            json,
        } => match (cri_archive, args.as_slice()) {
            (Some(archive), [reference]) => {
                push::run_cri_archive(&archive, reference, plain_http, json)
            }
            (None, [container, reference]) => {
                push::run(&cx, container, None, reference, plain_http, kube, json)
            }
            (None, [container, checkpoint, reference]) => push::run(
                &cx,
                container,
                Some(checkpoint),
                reference,
                plain_http,
                kube,
                json,
            ),
            (Some(_), _) => usage("push --cri-archive ARCHIVE takes REF alone"),
            (None, _) => usage("push takes CONTAINER [CHECKPOINT] REF"),
        },
        Command::Pull {
            reference,
            into,
            output,
            plain_http,
            json,
        } => {
            let target = match (&into, &output) {
                (Some(c), _) => pull::Target::Into(c),
                (None, Some(dir)) => pull::Target::Output(dir),
                (None, None) => unreachable!("clap requires --into or --output"),
            };
            pull::run(&cx, &reference, target, plain_http, json)
        }
        Command::Journal { container, json } => journal::run(&cx, &container, json),
        Command::Gateway {
            listen,
            upstream,
            maps,
            limits,
        } => gateway::run(&cx, listen, upstream, maps, limits),
    }
}

/// Prints `value` as indented JSON.
fn print_pretty(value: &impl serde::Serialize) -> Result<()> {
    println!(
        "{}",
        serde_json::to_string_pretty(value).map_err(Error::Print)?
    );
    Ok(())
}
