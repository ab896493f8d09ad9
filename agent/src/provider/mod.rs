//! Providers: one thin client per wire format. They turn a
//! [`TurnRequest`] into HTTP (or a script), parse the answer leniently,
//! report [`StreamEvent`]s as they arrive, and return the [`Turn`]. They
//! never execute anything.

use crate::model::{ProviderError, StreamEvent, Turn, TurnRequest};

/// A model behind a wire format.
#[allow(async_fn_in_trait)]
pub trait Provider {
    /// A short name for the ledger (`openai`, `ollama`, `anthropic`, `script`).
    fn name(&self) -> &str;
    /// Run one turn; `on_event` sees text, reasoning and completed tool
    /// calls as they stream.
    async fn turn(
        &mut self,
        req: &TurnRequest,
        on_event: &mut (dyn FnMut(StreamEvent) + Send),
    ) -> Result<Turn, ProviderError>;
}
