//! `retie __sandbox-helper`: the single-threaded helper a multi-threaded
//! program (the agent) spawns to run one sandbox. See
//! `retie_runtime::helper`.

use clap::Args;

#[derive(Args)]
pub struct HelperArgs {
    /// fd for the JSON reply.
    #[arg(long, required_unless_present = "print_request")]
    pub reply_fd: Option<i32>,
    /// fd the JSON request (the sandbox spec) is read from, to EOF.
    #[arg(long, default_value_t = 4)]
    pub request_fd: i32,
    /// Print the request a caller would send for CMD in WORKSPACE (the
    /// built-in profile, the workspace bound directly) and exit: for the
    /// benchmarks, which drive the helper without a Rust caller.
    #[arg(long, requires = "workspace")]
    pub print_request: bool,
    /// The workspace of `--print-request`.
    #[arg(long)]
    pub workspace: Option<std::path::PathBuf>,
    /// The command of `--print-request`.
    #[arg(last = true)]
    pub command: Vec<String>,
}

pub fn run(args: HelperArgs) -> i32 {
    if args.print_request {
        return match print_request(&args) {
            Ok(()) => 0,
            Err(e) => {
                crate::ui::say_error(&e);
                crate::error::EXIT_FAILED
            }
        };
    }
    match args.reply_fd {
        Some(fd) => retie_runtime::helper::serve(fd, args.request_fd),
        None => crate::error::EXIT_FAILED,
    }
}

fn print_request(args: &HelperArgs) -> Result<(), crate::error::CliError> {
    let ws = args
        .workspace
        .as_ref()
        .ok_or_else(|| crate::error::CliError::Usage("--workspace is required".into()))?;
    let spec = retie_runtime::Sandbox::builder(&args.command)
        .workspace(ws)
        .profile(retie_runtime::Profile::host()?)
        .build()?;
    let wire = retie_runtime::helper::Request::from(&spec);
    println!(
        "{}",
        serde_json::to_string(&wire).map_err(|e| crate::error::CliError::Usage(e.to_string()))?
    );
    Ok(())
}
