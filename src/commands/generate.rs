//! `retie __generate`: the man pages and shell completions, rendered from
//! the one clap definition (`Cli` in main.rs), for `scripts/release.sh`
//! and packagers. Hidden: people read the results, not this command.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand, ValueEnum};

use crate::error::CliError;

#[derive(Args)]
pub struct GenerateArgs {
    #[command(subcommand)]
    pub what: What,
}

#[derive(Subcommand)]
pub enum What {
    /// Man pages (section 1): DIR/retie.1 and one page per subcommand
    /// (retie-sandbox-exec.1, ...).
    Man {
        /// Directory to write into (created if missing).
        dir: PathBuf,
    },
    /// A completion script for SHELL: DIR/retie.bash, DIR/_retie (zsh) or
    /// DIR/retie.fish.
    Completions {
        /// The shell.
        shell: Shell,
        /// Directory to write into (created if missing).
        dir: PathBuf,
    },
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

/// Write what `args` asks for; `cmd` is the CLI's definition.
pub fn run(args: GenerateArgs, cmd: clap::Command) -> Result<i32, CliError> {
    let dir = match &args.what {
        What::Man { dir } | What::Completions { dir, .. } => dir,
    };
    create(dir)?;
    let cmd = for_people(&cmd);
    match args.what {
        What::Man { dir } => {
            let mut cmd = cmd;
            // Subcommands get their full display names (`retie-sandbox-exec`)
            // only once the command is built.
            cmd.build();
            clap_mangen::generate_to(cmd, &dir).map_err(|e| {
                CliError::io(format!("writing man pages into {}", dir.display()), e)
            })?;
            println!("{}", dir.join("retie.1").display());
        }
        What::Completions { shell, dir } => {
            let mut cmd = cmd;
            let path = match shell {
                Shell::Bash => {
                    clap_complete::generate_to(clap_complete::Shell::Bash, &mut cmd, "retie", &dir)
                }
                Shell::Zsh => {
                    clap_complete::generate_to(clap_complete::Shell::Zsh, &mut cmd, "retie", &dir)
                }
                Shell::Fish => {
                    clap_complete::generate_to(clap_complete::Shell::Fish, &mut cmd, "retie", &dir)
                }
            }
            .map_err(|e| CliError::io(format!("writing completions into {}", dir.display()), e))?;
            println!("{}", path.display());
        }
    }
    Ok(0)
}

/// The definition as people meet it: without the hidden internal
/// subcommands (`__probe`, ...: the completion generators offer hidden
/// subcommands too) and without the generated `help` subcommands (a man
/// page each otherwise).
fn for_people(cmd: &clap::Command) -> clap::Command {
    let mut out = clap::Command::new("retie")
        .bin_name("retie")
        .version(env!("CARGO_PKG_VERSION"))
        .propagate_version(true)
        .disable_help_subcommand(true);
    if let Some(a) = cmd.get_about() {
        out = out.about(a.clone());
    }
    if let Some(a) = cmd.get_long_about() {
        out = out.long_about(a.clone());
    }
    for a in cmd
        .get_arguments()
        .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
    {
        out = out.arg(a.clone());
    }
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        out = out.subcommand(sub.clone());
    }
    out.mut_subcommands(no_help_subcommand)
}

fn no_help_subcommand(cmd: clap::Command) -> clap::Command {
    cmd.disable_help_subcommand(true)
        .mut_subcommands(no_help_subcommand)
}

fn create(dir: &Path) -> Result<(), CliError> {
    std::fs::create_dir_all(dir).map_err(|e| CliError::io(format!("creating {}", dir.display()), e))
}
