//! The `belayer` command line: checkpoint, list, inspect, restore, fork and remove checkpoints of
//! containers managed by containerd (any namespace, docker's `moby` too). Speaks each shim's
//! control socket ([`api`](crate::api)) and containerd's gRPC API.

pub mod containerd;
pub mod control;
pub mod gateway;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::api;

#[derive(Parser, Debug)]
#[command(
    name = "belayer",
    version,
    about = "Full checkpoint and restore of containerd containers"
)]
pub struct Cli {
    /// containerd's gRPC socket.
    #[arg(
        long,
        global = true,
        env = "CONTAINERD_ADDRESS",
        default_value = "/run/containerd/containerd.sock"
    )]
    pub address: PathBuf,
    /// containerd namespace (docker's is `moby`).
    #[arg(
        long,
        short = 'n',
        global = true,
        env = "CONTAINERD_NAMESPACE",
        default_value = "default"
    )]
    pub namespace: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
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
    /// Print the action journal: one action a line.
    Journal {
        container: String,
        /// Print JSON lines instead.
        #[arg(long)]
        json: bool,
    },
}

/// Runs the CLI; the error is the one line printed on stderr.
pub fn run(cli: Cli) -> Result<(), String> {
    let ns = cli.namespace.clone();
    let ctl = |c: &str| control::Control::new(&ns, c);
    let settings = crate::settings::Settings::load()?;
    let store = settings.store();
    let containerd = containerd::Containerd::new(&cli.address, &cli.namespace);
    match cli.command {
        Command::Checkpoint { container, exit } => {
            let ctl = ctl(&container).require(&containerd)?;
            let info: api::CheckpointInfo =
                ctl.call("POST", "checkpoint", Some(&api::CheckpointRequest { exit }))?;
            println!("{}", info.id);
        }
        Command::Checkpoints { container } => {
            for seq in list(&containerd, &store, &ns, &container)? {
                println!("{seq}");
            }
        }
        Command::Inspect {
            container,
            checkpoint,
        } => {
            let seq = api::parse_checkpoint_id(&checkpoint)?;
            let cp = store
                .load(&ns, &container, seq)
                .map_err(|e| not_found_or(&containerd, &container, e))?;
            let info = api::CheckpointInfo::from(&cp);
            println!(
                "{}",
                serde_json::to_string_pretty(&info).map_err(|e| e.to_string())?
            );
        }
        Command::Restore {
            container,
            checkpoint,
        } => {
            let seq = checkpoint
                .as_deref()
                .map(api::parse_checkpoint_id)
                .transpose()?;
            let c = ctl(&container);
            if c.exists() {
                let _: api::RestoreInfo = c.call(
                    "POST",
                    "restore",
                    Some(&api::RestoreRequest { checkpoint: seq }),
                )?;
            } else {
                let seq = match seq {
                    Some(s) => s,
                    None => *list(&containerd, &store, &ns, &container)?
                        .last()
                        .ok_or_else(|| format!("container {container} has no checkpoints"))?,
                };
                containerd.restore_task(&container, seq)?;
            }
        }
        Command::Fork {
            container,
            checkpoint,
            count,
        } => {
            let seq = api::parse_checkpoint_id(&checkpoint)?;
            store
                .load(&ns, &container, seq)
                .map_err(|e| not_found_or(&containerd, &container, e))?;
            for id in containerd.fork(&container, seq, count)? {
                println!("{id}");
            }
        }
        Command::Hint {
            container,
            hint,
            expected_ms,
            expected_tokens,
        } => {
            let ctl = ctl(&container).require(&containerd)?;
            let req = api::HintRequest {
                hint,
                expected_ms,
                expected_tokens,
            };
            ctl.call::<serde_json::Value>("POST", "hint", Some(&req))?;
        }
        Command::Gateway {
            listen,
            upstream,
            maps,
            limits,
        } => gateway::run(gateway::Config {
            listen,
            upstream,
            maps,
            namespace: ns.clone(),
            limits,
        })?,
        Command::Status { container } => {
            let ctl = ctl(&container).require(&containerd)?;
            let status: serde_json::Value = ctl.call("GET", "status", None::<&()>)?;
            println!(
                "{}",
                serde_json::to_string_pretty(&status).map_err(|e| e.to_string())?
            );
        }
        Command::Journal { container, json } => {
            let ctl = ctl(&container).require(&containerd)?;
            let entries: Vec<crate::journal::Entry> = ctl.call("GET", "journal", None::<&()>)?;
            for e in entries {
                if json {
                    println!("{}", serde_json::to_string(&e).map_err(|e| e.to_string())?);
                } else {
                    let code = e
                        .exit_code
                        .map_or("running".to_string(), |c| format!("exit={c}"));
                    let after = e
                        .after_checkpoint
                        .map_or("-".to_string(), |c| c.to_string());
                    let took = e.ended_unix_ms.map_or(String::new(), |end| {
                        format!(" {}ms", end.saturating_sub(e.started_unix_ms))
                    });
                    println!(
                        "{}\t{}\t{code}{took}\tafter-checkpoint={after}\tcwd={}\t{}",
                        e.index,
                        e.exec_id,
                        e.cwd,
                        e.args.join(" ")
                    );
                }
            }
        }
        Command::Rm {
            container,
            checkpoint,
        } => {
            let seq = api::parse_checkpoint_id(&checkpoint)?;
            let c = ctl(&container);
            if c.exists() {
                c.call::<serde_json::Value>("DELETE", &format!("checkpoints/{seq}"), None::<&()>)?;
            } else {
                store
                    .delete(&ns, &container, seq)
                    .map_err(|e| not_found_or(&containerd, &container, e))?;
            }
        }
    }
    Ok(())
}

fn list(
    containerd: &containerd::Containerd,
    store: &criu_bridge::Store,
    ns: &str,
    container: &str,
) -> Result<Vec<u64>, String> {
    let seqs = store
        .list(ns, container)
        .map_err(|e| crate::checkpoint::chain(&e))?;
    if seqs.is_empty() {
        containerd.container(container)?;
    }
    Ok(seqs)
}

/// A store error, unless the container itself is unknown to containerd (then that).
fn not_found_or(
    containerd: &containerd::Containerd,
    container: &str,
    e: criu_bridge::store::StoreError,
) -> String {
    match containerd.container(container) {
        Err(missing) => missing,
        Ok(_) => crate::checkpoint::chain(&e),
    }
}
