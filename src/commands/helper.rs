//! `retie __sandbox-helper`: the single-threaded helper a multi-threaded
//! program (the agent) spawns to run one sandbox. See
//! `retie_runtime::helper`.

use clap::Args;

#[derive(Args)]
pub struct HelperArgs {
    /// fd for the JSON reply.
    #[arg(long)]
    pub reply_fd: i32,
    /// fd the JSON request (the sandbox spec) is read from, to EOF.
    #[arg(long, default_value_t = 4)]
    pub request_fd: i32,
}

pub fn run(args: HelperArgs) -> i32 {
    retie_runtime::helper::serve(args.reply_fd, args.request_fd)
}
