//! `retie run [DIR]` with no `-p`, on a terminal: a conversation. The
//! person types a task; the model's answer streams in; every tool call
//! goes through the chokepoint like in `-p` mode, and what the gate asks
//! is asked here (`approve`). Slash commands (`slash`) undo, replay, show
//! the changes and the grants, and change the autonomy or the model.
//!
//! Ctrl-C during a turn cancels it: a running sandbox is killed (the
//! supervisor turns the SIGINT into a SIGKILL of the sandbox's init, see
//! `retie_runtime::Interrupt::Kill` and ADR 0503), what ran stays
//! recorded, and the next prompt comes. At the prompt, Ctrl-C twice or
//! Ctrl-D ends the session: it is closed in the ledger and checkpointed.

mod approve;
mod editor;
mod render;
mod slash;
mod status;

use std::cell::RefCell;
use std::io::IsTerminal;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use retie_agent::provider::AnyProvider;
use retie_agent::session::{Session, Status, YesFlag};
use retie_dispatch::Approver;

use super::run::{self, RunArgs, EXIT_USAGE};
use crate::error::CliError;
use crate::ui::{visible, Style};

pub use editor::{LineEditor, Read};
pub use render::PlainRender;

/// The approval prompt for `retie run -p` on a terminal: the same as the
/// interactive session's (answers are never put in the history). Ctrl-C
/// at the prompt refuses and raises `cancel`.
pub fn terminal_approver(
    cancel: &'static AtomicBool,
) -> Result<approve::TerminalApprover, CliError> {
    Ok(approve::TerminalApprover {
        editor: Rc::new(RefCell::new(editor::LineEditor::open()?)),
        spin: render::Spinner::shared(),
        style: Style::stderr(),
        cancel,
        diff_lines: retie_display::DEFAULT_DIFF_LINES,
    })
}

/// The approval prompt on a shared line editor: `retie retest`'s
/// operator prompt reads the same terminal through the same editor.
pub fn terminal_approver_on(
    editor: Rc<RefCell<LineEditor>>,
    cancel: &'static AtomicBool,
) -> approve::TerminalApprover {
    approve::TerminalApprover {
        editor,
        spin: render::Spinner::shared(),
        style: Style::stderr(),
        cancel,
        diff_lines: retie_display::DEFAULT_DIFF_LINES,
    }
}

/// Raised by SIGINT (or by the bash tool when the supervisor consumed
/// one and killed the sandbox): the turn stops at the next step.
static CANCEL: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    CANCEL.store(true, Ordering::SeqCst);
}

pub fn run(args: RunArgs) -> i32 {
    if !std::io::stdin().is_terminal() {
        eprintln!(
            "retie: run needs -p PROMPT when its input is not a terminal (the interactive session reads the terminal)"
        );
        return EXIT_USAGE;
    }
    if args.json {
        eprintln!("retie: --json needs -p PROMPT (the interactive session prints for a person)");
        return EXIT_USAGE;
    }
    match chat(args) {
        Ok(code) => code,
        Err(e) => {
            crate::ui::say_failure(&e);
            EXIT_USAGE
        }
    }
}

fn chat(mut args: RunArgs) -> Result<i32, CliError> {
    if let Some(id) = args.resume.clone() {
        run::defaults_from_session(&mut args, &id)?;
    }
    let s = run::setup(&args, "interactive session", Some(&CANCEL))?;
    let resuming = s.rows.is_some();
    let provider = run::provider(&args, &s.r, s.provider_name, None, resuming)?;
    let editor = Rc::new(RefCell::new(editor::LineEditor::open()?));
    let spin = render::Spinner::shared();
    let err = Style::stderr();
    let mut terminal = approve::TerminalApprover {
        editor: editor.clone(),
        spin: spin.clone(),
        style: err,
        cancel: &CANCEL,
        diff_lines: s.r.diff_lines,
    };
    let mut yes = YesFlag;
    if args.yes {
        eprintln!(
            "retie: warning: --yes approves every action the gate asks about (never one the policy denies); the ledger records each such approval as coming from the flag"
        );
    }
    // SAFETY: installing a handler that only stores to an atomic, before
    // any thread exists; it replaces the default disposition of SIGINT.
    unsafe { libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t) };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::io("starting the async runtime", e))?;
    // The spinner's ticks: a task on this thread, run while a turn waits
    // on the provider (no thread is started).
    let ticker = {
        let spin = spin.clone();
        rt.spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(120)).await;
                if let Ok(mut g) = spin.lock() {
                    g.tick();
                }
            }
        })
    };
    run::print_start(s.provider_name, &s.r, &s.ws);
    let cache_key = retie_agent::catalogue::Cache::key(
        s.provider_name,
        s.r.cfg.base_url.as_deref().unwrap_or(""),
    );
    let prices = s.r.prices.clone();
    let ledger_path = s.ledger_path.clone();
    let mut session: Session<AnyProvider> = match &s.rows {
        None => Session::open(provider, s.tools, s.rec, s.r.cfg),
        Some(rows) => Session::resume(provider, s.tools, s.rec, s.r.cfg, rows)
            .map_err(|e| CliError::Usage(e.to_string()))?,
    };
    eprintln!(
        "retie: interactive session {} · /help for commands · Ctrl-C cancels a turn · Ctrl-D ends",
        visible(session.id())
    );
    let mut ui = render::ChatRender::new(spin.clone());
    ui.diff_lines = s.r.diff_lines;
    let mut tasks = 0u64;
    if resuming {
        if let Some((was, now)) = session.tier_change() {
            crate::ui::say_tier_change(was, now);
        }
        if let Some(p) = session.resumed_pending() {
            eprintln!(
                "retie: resumed at pending approval {}: {}\n  digest: {}",
                p.pending,
                crate::ui::visible_again(&p.summary, false),
                p.digest
            );
        } else {
            eprintln!("retie: resumed ({} turns so far)", session.turns());
        }
        // What was under way (a pending approval, results the model has
        // not read) is carried on before the next task is asked for.
        if !session.waiting_for_input() {
            render::start(&spin, "thinking");
            let approver: &mut dyn Approver = if args.yes { &mut yes } else { &mut terminal };
            let report = rt.block_on(session.send(None, approver, &mut ui));
            render::stop(&spin);
            ui.end_text();
            if report.status != Status::Finished {
                eprintln!("{}", err.yellow(&visible(&report.message)));
            }
        }
    }
    let mut ctrl_c = false;
    loop {
        let price = prices
            .get(&session.config().model)
            .map(|p| (p.input_per_mtok, p.output_per_mtok));
        status::show(&mut session, price, err);
        let line = match editor.borrow_mut().read("retie> ", true) {
            editor::Read::Eof => break,
            editor::Read::Interrupted if ctrl_c => break,
            editor::Read::Interrupted => {
                ctrl_c = true;
                eprintln!("{}", err.dim("(Ctrl-C again or Ctrl-D ends the session)"));
                continue;
            }
            editor::Read::Line(l) => l,
        };
        ctrl_c = false;
        let task = line.trim();
        if task.is_empty() {
            continue;
        }
        if slash::ends_session(task) {
            break;
        }
        if task.starts_with('/') {
            slash::run(
                task,
                slash::Ctx {
                    ledger_path: &ledger_path,
                    session: &mut session,
                    price,
                    style: err,
                },
            );
            continue;
        }
        CANCEL.store(false, Ordering::SeqCst);
        session.cancel_token().reset();
        render::start(&spin, "thinking");
        let approver: &mut dyn Approver = if args.yes { &mut yes } else { &mut terminal };
        let report = rt.block_on(session.send(Some(task), approver, &mut ui));
        render::stop(&spin);
        ui.end_text();
        tasks += 1;
        match report.status {
            Status::Finished => {}
            Status::Interrupted => eprintln!(
                "{}",
                err.yellow("cancelled: the turn stopped; what ran is recorded (/replay, /undo)")
            ),
            Status::Failed => {
                eprintln!("retie: {}", visible(&report.message));
                break;
            }
            _ => eprintln!("{}", err.yellow(&visible(&report.message))),
        }
        CANCEL.store(false, Ordering::SeqCst);
    }
    ticker.abort();
    let id = session.id().to_string();
    let (turns, usage) = (session.turns(), session.usage());
    if let Some(l) = session.ladder() {
        super::models::remember_refusals(&cache_key, &id, l.refused());
    }
    match session.close() {
        Ok(()) => eprintln!(
            "retie: session {} closed ({} tasks, {} turns, {} tokens in / {} out)",
            visible(&id),
            tasks,
            turns,
            usage.input_tokens,
            usage.output_tokens
        ),
        Err(e) => {
            eprintln!("retie: the ledger session could not be closed: {e}");
            return Ok(run::EXIT_FAILED);
        }
    }
    Ok(0)
}
