//! A cap on MCP sessions over HTTP. Every session holds a worker and its buffers until the
//! client sends DELETE or it sits idle for the transport's keep-alive (5 minutes): 2,000 clients
//! that never close would hold about 110 MB. At the cap, opening one more closes the session
//! that has been idle longest (its client gets 404 and, as MCP asks, initializes again).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::{EventStore, ServerSseMessage};
use rmcp::transport::streamable_http_server::{RestoreOutcome, SessionId, SessionManager};
use tokio_stream::Stream;
use toolsmith_contract::sync::lock;

/// `M`'s sessions, at most `cap` of them.
pub(crate) struct CappedSessions<M> {
    inner: M,
    cap: usize,
    /// When each open session last saw a request.
    last_seen: Mutex<HashMap<SessionId, Instant>>,
}

impl<M: SessionManager> CappedSessions<M> {
    pub(crate) fn new(inner: M, cap: usize) -> Self {
        CappedSessions { inner, cap: cap.max(1), last_seen: Mutex::new(HashMap::new()) }
    }

    fn touch(&self, id: &SessionId) {
        if let Some(seen) = lock(&self.last_seen).get_mut(id) {
            *seen = Instant::now();
        }
    }

    /// Closes the longest-idle sessions until one more fits (sessions the transport already
    /// closed on its own are forgotten first).
    async fn make_room(&self) {
        let ids: Vec<SessionId> = lock(&self.last_seen).keys().cloned().collect();
        for id in ids {
            if !self.inner.has_session(&id).await.unwrap_or(false) {
                lock(&self.last_seen).remove(&id);
            }
        }
        loop {
            let oldest = {
                let seen = lock(&self.last_seen);
                if seen.len() < self.cap {
                    return;
                }
                seen.iter().min_by_key(|(_, t)| **t).map(|(id, _)| id.clone())
            };
            let Some(id) = oldest else { return };
            tracing::info!(session = %id, cap = self.cap, "closed the longest-idle MCP session to open a new one");
            lock(&self.last_seen).remove(&id);
            if let Err(e) = self.inner.close_session(&id).await {
                tracing::warn!(session = %id, "cannot close an idle session: {e}");
            }
        }
    }

    /// Open sessions (for the status report).
    #[cfg(test)]
    fn open(&self) -> usize {
        lock(&self.last_seen).len()
    }
}

impl<M: SessionManager> SessionManager for CappedSessions<M> {
    type Error = M::Error;
    type Transport = M::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        self.make_room().await;
        let (id, transport) = self.inner.create_session().await?;
        lock(&self.last_seen).insert(id.clone(), Instant::now());
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        self.touch(id);
        self.inner.initialize_session(id, message).await
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.inner.has_session(id).await
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        lock(&self.last_seen).remove(id);
        self.inner.close_session(id).await
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.touch(id);
        self.inner.create_stream(id, message).await
    }

    async fn accept_message(&self, id: &SessionId, message: ClientJsonRpcMessage) -> Result<(), Self::Error> {
        self.touch(id);
        self.inner.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.touch(id);
        self.inner.create_standalone_stream(id).await
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.touch(id);
        self.inner.resume(id, last_event_id).await
    }

    async fn restore_session(&self, id: SessionId) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        self.inner.restore_session(id).await
    }

    fn event_store(&self) -> Option<std::sync::Arc<dyn EventStore>> {
        self.inner.event_store()
    }
}

#[cfg(test)]
mod tests {
    use super::CappedSessions;
    use rmcp::transport::streamable_http_server::SessionManager;
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;

    #[tokio::test]
    async fn the_longest_idle_session_makes_room() {
        let sessions = CappedSessions::new(LocalSessionManager::default(), 2);
        let (first, _a) = sessions.create_session().await.expect("first");
        let (second, _b) = sessions.create_session().await.expect("second");
        // The first is used again, so the second is now the longest idle.
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        sessions.touch(&first);
        let (third, _c) = sessions.create_session().await.expect("third");
        assert_eq!(sessions.open(), 2);
        assert!(sessions.has_session(&first).await.expect("has"));
        assert!(!sessions.has_session(&second).await.expect("has"));
        assert!(sessions.has_session(&third).await.expect("has"));
    }
}
