//! `belayer`, the Belayer command line: checkpoint, list, inspect, restore, fork and remove
//! checkpoints of containers managed by containerd (any namespace, docker's `moby` too); push
//! them to an OCI registry and pull them into a container on another node; hints;
//! status and journal; the LLM gateway. Speaks each shim's control socket
//! ([`belayer_api`]) and containerd's gRPC API. One file per verb under `commands/`; exit codes in
//! [`error`].

mod commands;
mod containerd;
mod control;
mod error;
mod gateway;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "belayer",
    version,
    about = "Full checkpoint and restore of containerd containers",
    after_help = "Exit codes: 0 success; 1 any other failure; 2 bad command line; 3 no such \
                  container or checkpoint; 4 conflict (a checkpoint or restore under way, the \
                  container not running or without a Belayer task); 5 corrupt checkpoint; 6 try \
                  again later; 7 disk full; 8 invalid argument."
)]
struct Cli {
    /// containerd's gRPC socket.
    #[arg(
        long,
        global = true,
        env = "CONTAINERD_ADDRESS",
        default_value = "/run/containerd/containerd.sock"
    )]
    address: PathBuf,
    /// containerd namespace (docker's is `moby`).
    #[arg(
        long,
        short = 'n',
        global = true,
        env = "CONTAINERD_NAMESPACE",
        default_value = "default"
    )]
    namespace: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Checkpoint a running container (processes and filesystem); prints the checkpoint id.
    Checkpoint {
        container: String,
        /// Stop the container after the checkpoint.
        #[arg(long)]
        exit: bool,
    },
    /// List a container's checkpoint ids, oldest first.
    Checkpoints { container: String },
    /// Show a checkpoint as JSON.
    Inspect {
        container: String,
        checkpoint: String,
    },
    /// Restore a container in place from a checkpoint (default: the newest).
    Restore {
        container: String,
        #[arg(long)]
        checkpoint: Option<String>,
        /// Print what was restored as one JSON line: for a restore in place, the shim's answer
        /// with where its time went (`verify_ms`, `mount_ms`, `restore_ms`, `total_ms`).
        #[arg(long)]
        json: bool,
    },
    /// Start N new containers from a checkpoint, each with its own writable layer; prints their ids.
    Fork {
        container: String,
        #[arg(long)]
        checkpoint: String,
        #[arg(long, default_value_t = 1)]
        count: u32,
    },
    /// Remove a checkpoint.
    Rm {
        container: String,
        checkpoint: String,
    },
    /// Tell the checkpoint scheduler the model started (`llm-start`) or finished (`llm-end`)
    /// generating the container's next action.
    Hint {
        container: String,
        #[arg(value_parser = ["llm-start", "llm-end"])]
        hint: String,
        /// Expected generation time (with llm-start).
        #[arg(long)]
        expected_ms: Option<u64>,
        /// Expected tokens to generate (with llm-start).
        #[arg(long)]
        expected_tokens: Option<u64>,
    },
    /// Show a container's Belayer state as JSON: policy, checkpoints, journal position, recoveries.
    Status { container: String },
    /// Serve an HTTP pass-through to an OpenAI-compatible LLM server that sends each mapped
    /// request's container `llm-start`/`llm-end` hints (README, "LLM gateway").
    Gateway {
        /// Address to listen on (`127.0.0.1:0`: any free port; the first stdout line says which).
        #[arg(long)]
        listen: std::net::SocketAddr,
        /// The LLM server, `http://HOST:PORT[/PREFIX]`.
        #[arg(long)]
        upstream: String,
        /// KEY=CONTAINER: requests whose bearer token or JSON `user` field is KEY are for
        /// CONTAINER (after the `X-Belayer-Container` header). Repeatable.
        #[arg(long = "map", value_name = "KEY=CONTAINER", value_parser = gateway::parse_map)]
        maps: Vec<(String, String)>,
        #[command(flatten)]
        limits: gateway::Limits,
    },
    /// Push a checkpoint (default: the newest) to an OCI registry: `belayer push CONTAINER
    /// [CHECKPOINT] REF`, REF being `host[:port]/repository:tag`. Uploads only the blobs the
    /// registry lacks; prints REF pinned to the manifest's digest, then the bytes uploaded and
    /// skipped. Credentials: the docker config (`$DOCKER_CONFIG/config.json`, `~/.docker/config.json`).
    /// `belayer push --kube CONTAINER [CHECKPOINT] REF` pushes it as the checkpoint image a pod
    /// on another node restores from through CRI; `belayer push --cri-archive ARCHIVE REF`
    /// pushes a Kubernetes checkpoint archive as such an image.
    Push {
        /// `CONTAINER [CHECKPOINT] REF`, or `REF` alone with `--cri-archive`.
        #[arg(num_args = 1..=3, required = true, value_names = ["CONTAINER", "CHECKPOINT", "REF"])]
        args: Vec<String>,
        /// Push the checkpoint of a Kubernetes container (one CRI runs on Belayer's handler) as
        /// an OCI checkpoint image (one layer, checkpointctl's annotations) that containerd's
        /// CRI restores a container from, as it restores one from the kubelet's checkpoint
        /// archive, instead of as Belayer's artifact.
        #[arg(long, conflicts_with = "cri_archive")]
        kube: bool,
        /// A checkpoint archive written by Kubernetes (the kubelet's checkpoint API, CRI
        /// `CheckpointContainer`), pushed as an OCI checkpoint image (one layer, checkpointctl's
        /// annotations) that containerd's CRI restores a container from, as `checkpointctl build`
        /// makes them.
        #[arg(long, value_name = "ARCHIVE")]
        cri_archive: Option<PathBuf>,
        /// Plain HTTP to a registry that is not on loopback (TLS is not implemented yet).
        #[arg(long)]
        plain_http: bool,
        /// Print what was pushed as one JSON line.
        #[arg(long)]
        json: bool,
    },
    /// Pull a checkpoint pushed with `belayer push` (REF `host[:port]/repository:tag` or
    /// `…@sha256:…`) and restore it into a container created without a task (`--into`), or only
    /// write its export to a directory (`--output`). It passes every check of an import.
    Pull {
        reference: String,
        /// A container of Belayer's runtime with no task, created from the checkpointed
        /// container's image (`ctr container create --runtime io.containerd.belayer.v1 …`).
        #[arg(long, required_unless_present = "output", conflicts_with = "output")]
        into: Option<String>,
        /// A directory (which must not exist) to write the export into.
        #[arg(long)]
        output: Option<PathBuf>,
        /// Plain HTTP to a registry that is not on loopback (TLS is not implemented yet).
        #[arg(long)]
        plain_http: bool,
        /// Print what was pulled as one JSON line.
        #[arg(long)]
        json: bool,
    },
    /// Print the action journal: one action a line.
    Journal {
        container: String,
        /// Print JSON lines instead.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match commands::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: errors carry CRIU's log lines and sources, joined.
            eprintln!("belayer: {}", error::one_line(&e));
            e.exit_code()
        }
    }
}
