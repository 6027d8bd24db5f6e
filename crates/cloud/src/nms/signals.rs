//! Signals between instances that share a PostgreSQL registry (LISTEN/NOTIFY).

use super::*;

impl Nms {
    /// Starts listening for the signals other instances send through the shared store
    /// (PostgreSQL LISTEN/NOTIFY); `None` for a store that is not shared. The cloud does this
    /// before it serves: a signal sent to a client here before the LISTEN is in place would
    /// be lost (PostgreSQL keeps no notification for a session that was not listening).
    ///
    /// # Errors
    /// The store cannot be reached.
    pub async fn listen_for_signals(&self) -> Result<Option<PgListener>, sqlx::Error> {
        if !self.store.is_shared() {
            return Ok(None);
        }
        let mut l = PgListener::connect(self.store.url()).await?;
        l.listen(crate::store::SIGNAL_CHANNEL).await?;
        tracing::info!("listening for signals from other cloud instances");
        Ok(Some(l))
    }

    /// Delivers the signals `listener` ([`Nms::listen_for_signals`]) hears to clients
    /// connected here, until the task is dropped, listening again when the connection is
    /// lost. Returns at once without a listener (a store that is not shared).
    pub async fn signals(self: Arc<Self>, listener: Option<PgListener>) {
        let Some(mut listener) = listener else {
            return;
        };
        loop {
            loop {
                match listener.recv().await {
                    Ok(n) => match serde_json::from_str::<Signal>(n.payload()) {
                        Ok(s) => {
                            self.push(&s.to, s.msg);
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "unreadable signal from another instance");
                        }
                    },
                    Err(e) => {
                        tracing::warn!(error = %e, "signal listener lost; reconnecting");
                        break;
                    }
                }
            }
            listener = loop {
                match self.listen_for_signals().await {
                    Ok(Some(l)) => break l,
                    Ok(None) => return,
                    Err(e) => {
                        tracing::warn!(error = %e, "listening for other instances' signals; retrying");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            };
        }
    }
}
