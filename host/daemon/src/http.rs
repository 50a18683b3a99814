//! The HTTP listener: MCP's streamable HTTP transport at `/mcp`, and a small status API.
//!
//! - `POST|GET|DELETE /mcp`: streamable HTTP (sessions, so server notifications such as
//!   `tools/list_changed` reach clients on their GET stream).
//! - `GET /health`: `ok`, never authenticated (for load balancers and scripts).
//! - `GET /status`: [`StatusReport`](super::StatusReport) as JSON.
//! - `GET /graph` and its API: the live tool-graph page ([`super::graph_page`]).
//!
//! Protection for a server that runs tools on this machine:
//! - a bearer token, required on `/mcp`, `/status` and `/graph` when set (and required to listen
//!   on anything but a loopback address); a browser opens the graph page once with `?token=`
//!   and then carries it in an HttpOnly, same-site cookie;
//! - `Host` checked against the listening names (DNS rebinding), and a browser's `Origin` checked
//!   against an allowlist (loopback origins by default);
//! - every state-changing request (any method but GET, HEAD and OPTIONS) refused when a browser
//!   sends it from another site, token or not: a foreign `Origin` or `Sec-Fetch-Site: cross-site`
//!   gets 403, and a body that is not `application/json` gets 415 (an HTML form or a `no-cors`
//!   fetch can only send form and text bodies);
//! - a cap on request bodies, and `X-Content-Type-Options: nosniff` on every response.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use serde_json::json;

use super::mcp_server::McpHandler;
use super::sessions::CappedSessions;
use super::{Daemon, DaemonError};

/// How the HTTP listener is exposed.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// Where to listen; port 0 picks a free port.
    pub addr: SocketAddr,
    /// Clients must send `Authorization: Bearer <token>`.
    pub token: Option<String>,
    /// `Host` values accepted besides the loopback names and the listening address.
    pub allowed_hosts: Vec<String>,
    /// Browser origins accepted besides `http://localhost:*` and `http://127.0.0.1:*`.
    pub allowed_origins: Vec<String>,
    /// Largest request body in bytes.
    pub max_body_bytes: usize,
    /// How long shutdown waits for running calls.
    pub drain_timeout: Duration,
    /// Open MCP sessions at most; one more closes the longest-idle one.
    pub max_sessions: usize,
    /// More routes served beside MCP, behind the same token (e.g. a policy's
    /// `/v1/chat/completions`).
    pub extra_routes: Option<Router>,
}

impl HttpOptions {
    /// Loopback on `addr`'s port, no token, 4 MiB bodies, 256 sessions.
    pub fn new(addr: SocketAddr) -> HttpOptions {
        HttpOptions {
            addr,
            token: None,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            max_body_bytes: 4 << 20,
            drain_timeout: Duration::from_secs(30),
            max_sessions: 256,
            extra_routes: None,
        }
    }
}

/// A bound listener, ready to serve.
#[derive(Debug)]
pub struct HttpServer {
    listener: tokio::net::TcpListener,
    router: Router,
    daemon: Daemon,
    drain_timeout: Duration,
}

impl HttpServer {
    /// Binds the listener. Refuses a non-loopback address without a token.
    pub async fn bind(daemon: Daemon, options: HttpOptions) -> Result<HttpServer, DaemonError> {
        let (listener, guard) = Guard::listen(options.addr, options.token.clone(), &options).await?;
        let config = StreamableHttpServerConfig::default()
            .with_allowed_hosts(guard.hosts.clone())
            .with_allowed_origins(guard.origins.clone())
            .enforce_origin_validation()
            .with_max_request_body_bytes(options.max_body_bytes)
            .with_cancellation_token(daemon.shutdown_token().child_token());
        let for_sessions = daemon.clone();
        let mcp = StreamableHttpService::new(
            move || Ok(McpHandler::new(for_sessions.clone())),
            Arc::new(CappedSessions::new(LocalSessionManager::default(), options.max_sessions)),
            config,
        );
        let limit = options.max_body_bytes;
        let mcp = Router::new()
            .nest_service("/mcp", mcp)
            .route_layer(axum::middleware::from_fn(move |r, n| check_json_rpc(limit, r, n)));
        let protected = guard.wrap(
            Router::new()
                .merge(mcp)
                .route("/status", get(status))
                .with_state(daemon.clone())
                .merge(super::graph_page::routes(daemon.clone()))
                .merge(options.extra_routes.unwrap_or_default()),
        );
        let router = finish(Router::new().route("/health", get(|| async { "ok" })).merge(protected), limit);
        Ok(HttpServer { listener, router, daemon, drain_timeout: options.drain_timeout })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> Result<SocketAddr, DaemonError> {
        self.listener
            .local_addr()
            .map_err(|source| DaemonError::Io { context: "cannot read the listening address".into(), source })
    }

    /// Serves until `stop` resolves; then running calls are finished (up to the drain timeout),
    /// sessions are closed and the listener stops.
    pub async fn serve(self, stop: impl Future<Output = ()> + Send + 'static) -> Result<(), DaemonError> {
        let HttpServer { listener, router, daemon, drain_timeout } = self;
        let token = daemon.shutdown_token();
        let drainer = daemon.clone();
        tokio::spawn(async move {
            stop.await;
            tracing::info!("shutting down: finishing running calls");
            let left = drainer.drain(drain_timeout).await;
            if left > 0 {
                tracing::warn!(left, "calls still running at the end of the drain timeout");
            }
        });
        axum::serve(listener, router)
            .with_graceful_shutdown(async move { token.cancelled().await })
            .await
            .map_err(|source| DaemonError::Io { context: "the HTTP server failed".into(), source })
    }
}

/// The protections of a listener that runs tools, for any router (the daemon's own, and the
/// environment server's): the bearer token, the cross-site refusal and the `Host` check.
#[derive(Debug, Clone)]
pub struct Guard {
    /// The bearer token clients must send, when set.
    pub token: Option<Arc<str>>,
    /// The listening port (the token cookie is named by it).
    pub port: u16,
    /// `Host` names answered: the loopback names, the listening address and those allowed.
    pub hosts: Vec<String>,
    /// Browser origins accepted: loopback ones and those allowed.
    pub origins: Vec<String>,
}

impl Guard {
    /// Binds `addr` for a server with these options' token, hosts and origins. Refuses a
    /// non-loopback address without a token, and an empty token.
    pub async fn listen(
        addr: SocketAddr,
        token: Option<String>,
        options: &HttpOptions,
    ) -> Result<(tokio::net::TcpListener, Guard), DaemonError> {
        if !addr.ip().is_loopback() && token.is_none() {
            return Err(DaemonError::Config(format!(
                "refusing to serve tools on {addr} without a bearer token: set --token-file (or TOOLSMITH_TOKEN), \
                 or listen on 127.0.0.1"
            )));
        }
        if token.as_deref().is_some_and(|t| t.trim().is_empty()) {
            return Err(DaemonError::Config("the bearer token is empty".into()));
        }
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| DaemonError::Io { context: format!("cannot listen on {addr}"), source })?;
        let local = listener
            .local_addr()
            .map_err(|source| DaemonError::Io { context: "cannot read the listening address".into(), source })?;
        let mut hosts: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into(), "[::1]".into()];
        hosts.push(local.ip().to_string());
        hosts.extend(options.allowed_hosts.iter().cloned());
        let mut origins: Vec<String> = vec!["http://localhost:*".into(), "http://127.0.0.1:*".into()];
        origins.extend(options.allowed_origins.iter().cloned());
        let guard = Guard { token: token.as_deref().map(Arc::from), port: local.port(), hosts, origins };
        Ok((listener, guard))
    }

    /// `router` behind the token, the cross-site refusal and the host check.
    pub fn wrap(&self, router: Router) -> Router {
        let allowed: Arc<Vec<String>> = Arc::new(self.hosts.iter().map(|h| h.to_ascii_lowercase()).collect());
        router
            .route_layer(axum::middleware::from_fn_with_state((self.token.clone(), self.port), require_token))
            .route_layer(axum::middleware::from_fn_with_state(Arc::new(self.origins.clone()), refuse_cross_site))
            .route_layer(axum::middleware::from_fn_with_state(allowed, check_host))
    }

    /// Whether a browser's `Origin` is one this server accepts: a WebSocket handshake is a GET,
    /// which the cross-site refusal lets pass, so a socket that changes state checks it itself.
    pub fn origin_allowed(&self, origin: &str) -> bool {
        self.origins.iter().any(|pattern| origin_matches(pattern, origin))
    }
}

/// Tells browsers not to guess a response's type, on every response of `router`, and caps its
/// request bodies at `limit` bytes.
pub fn finish(router: Router, limit: usize) -> Router {
    router.layer(axum::extract::DefaultBodyLimit::max(limit)).layer(axum::middleware::map_response(no_sniff))
}

async fn status(State(daemon): State<Daemon>) -> impl IntoResponse {
    axum::Json(daemon.status().await)
}

/// Answers a POST body that is not a JSON-RPC message with a JSON-RPC error (HTTP 400), the
/// same reply a stdio client gets, instead of the transport's plain-text rejection.
async fn check_json_rpc(limit: usize, request: Request, next: Next) -> Response {
    if request.method() != axum::http::Method::POST {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, limit).await {
        Ok(b) => b,
        Err(_) => {
            return (StatusCode::PAYLOAD_TOO_LARGE, format!("the request body exceeds {limit} bytes\n"))
                .into_response();
        }
    };
    let text = String::from_utf8_lossy(&bytes);
    if let Err(reply) = super::mcp_server::check_message(&text) {
        tracing::warn!("rejected a malformed JSON-RPC message over HTTP");
        return (StatusCode::BAD_REQUEST, [(header::CONTENT_TYPE, "application/json")], reply).into_response();
    }
    next.run(Request::from_parts(parts, axum::body::Body::from(bytes))).await
}

/// The cookie a browser keeps the token in, once it opened a page with `?token=`: named by the
/// port (cookies ignore ports, so servers on one host must not overwrite each other's), its value
/// hex-encoded (a token may hold `;` or spaces), and accepted only by the graph page's own GET
/// requests, which a browser cannot otherwise authenticate (an EventSource sends no headers).
fn cookie_name(port: u16) -> String {
    format!("toolsmith_token_{port}")
}

/// Lower-case hex of `bytes` (cookie values here, `tools/list` cursors in the daemon).
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of [`hex`]'s output; `None` for anything else.
pub(crate) fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

/// Every token the request carries, with whether it came from the query string: the header
/// (API clients), the port's cookie and `?token=` on the graph page's GET requests.
fn presented_tokens(request: &Request, port: u16) -> Vec<(Vec<u8>, bool)> {
    let headers = request.headers();
    let mut found = Vec::new();
    if let Some(bearer) = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(bearer_token) {
        found.push((bearer.as_bytes().to_vec(), false));
    }
    let path = request.uri().path();
    if request.method() != axum::http::Method::GET
        || !(path == "/graph" || path.starts_with("/graph.") || path.starts_with("/graph/"))
    {
        return found;
    }
    let name = cookie_name(port);
    for cookie in headers.get_all(header::COOKIE).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(';')) {
        if let Some(value) = cookie.trim().strip_prefix(name.as_str()).and_then(|c| c.strip_prefix('='))
            && let Some(token) = unhex(value)
        {
            found.push((token, false));
        }
    }
    for pair in request.uri().query().unwrap_or("").split('&') {
        if let Some(token) = pair.strip_prefix("token=").and_then(percent_decode) {
            found.push((token.into_bytes(), true));
        }
    }
    found
}

/// The credentials of an `Authorization: Bearer <token>` value: the scheme is case-insensitive
/// (RFC 9110, section 11.1), the token is taken as sent.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim_start_matches(' '))
}

/// `%XX` and `+` decoding of a query value; `None` when malformed.
fn percent_decode(value: &str) -> Option<String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

async fn require_token(State((token, port)): State<(Option<Arc<str>>, u16)>, request: Request, next: Next) -> Response {
    let Some(token) = token else {
        return next.run(request).await;
    };
    // Any matching token admits the request (a stale cookie must not hide a fresh `?token=`).
    let presented = presented_tokens(&request, port);
    let matched: Vec<bool> = presented.iter().map(|(t, _)| constant_time_eq(t, token.as_bytes())).collect();
    if matched.iter().any(|&m| m) {
        let from_query = presented.iter().zip(&matched).any(|((_, query), &m)| *query && m);
        let mut response = next.run(request).await;
        if from_query {
            let cookie = format!("{}={}; Path=/; HttpOnly; SameSite=Strict", cookie_name(port), hex(token.as_bytes()));
            if let Ok(value) = header::HeaderValue::from_str(&cookie) {
                response.headers_mut().append(header::SET_COOKIE, value);
            }
        }
        response
    } else {
        tracing::warn!(path = %request.uri().path(), "rejected a request without the bearer token");
        (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Bearer")], "a valid bearer token is required\n")
            .into_response()
    }
}

/// Refuses a state-changing request a browser sent from another site (cross-site request
/// forgery): without a token any page the user opens could otherwise queue or cancel jobs or swap
/// the served model, and with one a page could still replay whatever its cookie admits. Safe
/// methods pass (a cross-site page cannot read their answers), and so do clients that are not
/// browsers: they send neither `Origin` nor `Sec-Fetch-Site`.
async fn refuse_cross_site(State(origins): State<Arc<Vec<String>>>, request: Request, next: Next) -> Response {
    use axum::http::Method;
    let method = request.method();
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return next.run(request).await;
    }
    let headers = request.headers();
    let path = request.uri().path().to_owned();
    if headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()).is_some_and(|s| s.eq_ignore_ascii_case("cross-site"))
    {
        tracing::warn!(%path, "refused a cross-site request (Sec-Fetch-Site)");
        return forbidden("cross-site requests are refused");
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        if !origins.iter().any(|pattern| origin_matches(pattern, origin)) {
            tracing::warn!(%path, origin, "refused a request from a foreign origin");
            return forbidden(&format!("requests from origin {origin} are refused; see --allow-origin"));
        }
    }
    let content_type = headers.get(header::CONTENT_TYPE).map(|v| v.to_str().unwrap_or(""));
    let has_body = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).is_some_and(|n| n.trim() != "0")
        || headers.contains_key(header::TRANSFER_ENCODING);
    let json = content_type.is_some_and(is_json);
    if (content_type.is_some() || has_body) && !json {
        tracing::warn!(%path, content_type, "refused a body that is not JSON");
        let body = json!({"error": {"message": format!(
            "{method} {path} takes Content-Type: application/json, not {}",
            content_type.unwrap_or("none")
        )}});
        return (StatusCode::UNSUPPORTED_MEDIA_TYPE, axum::Json(body)).into_response();
    }
    next.run(request).await
}

fn forbidden(message: &str) -> Response {
    (StatusCode::FORBIDDEN, axum::Json(json!({"error": {"message": message}}))).into_response()
}

/// `application/json`, with or without parameters (`; charset=utf-8`).
fn is_json(content_type: &str) -> bool {
    content_type.split(';').next().is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

/// Whether `origin` is allowed by `pattern`: the same origin, or with a `:*` pattern the same
/// scheme and host on any port (`http://localhost:*` admits `http://localhost:3000`).
fn origin_matches(pattern: &str, origin: &str) -> bool {
    let (pattern, origin) = (pattern.to_ascii_lowercase(), origin.to_ascii_lowercase());
    match pattern.strip_suffix(":*") {
        Some(base) => {
            origin == base
                || origin
                    .strip_prefix(base)
                    .and_then(|rest| rest.strip_prefix(':'))
                    .is_some_and(|port| !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()))
        }
        None => origin == pattern.trim_end_matches('/'),
    }
}

/// Tells browsers not to guess a response's type (a JSON error must never run as a script).
async fn no_sniff(mut response: Response) -> Response {
    response.headers_mut().insert(header::X_CONTENT_TYPE_OPTIONS, header::HeaderValue::from_static("nosniff"));
    response
}

/// Refuses a `Host` that is not one of the listening names (DNS rebinding: a web page whose
/// name was pointed at this machine must not read the graph or the jobs). rmcp checks `/mcp` the
/// same way; this covers every route.
async fn check_host(State(allowed): State<Arc<Vec<String>>>, request: Request, next: Next) -> Response {
    let host = request.headers().get(header::HOST).and_then(|v| v.to_str().ok());
    if let Some(host) = host
        && !allowed.iter().any(|a| *a == host_name(host).to_ascii_lowercase())
    {
        tracing::warn!(host, "rejected a request for another host name");
        return (StatusCode::FORBIDDEN, format!("this server does not answer for host {host}; see --allow-host\n"))
            .into_response();
    }
    next.run(request).await
}

/// A `Host` value without its port: `127.0.0.1:8750` -> `127.0.0.1`, `[::1]:8750` -> `[::1]`.
fn host_name(host: &str) -> &str {
    if host.starts_with('[') {
        return host.find(']').map_or(host, |end| &host[..=end]);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// Compares without an early exit, so response timing says nothing about the token.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for (i, x) in a.iter().enumerate() {
        diff |= usize::from(x ^ b.get(i % b.len().max(1)).copied().unwrap_or(0));
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::{bearer_token, constant_time_eq, hex, host_name, is_json, origin_matches, percent_decode, unhex};

    #[test]
    fn origins_match_their_patterns() {
        assert!(origin_matches("http://localhost:*", "http://localhost:3000"));
        assert!(origin_matches("http://localhost:*", "http://LOCALHOST"));
        assert!(!origin_matches("http://localhost:*", "http://localhost.evil.example"));
        assert!(!origin_matches("http://localhost:*", "http://localhost:3000.evil.example"));
        assert!(!origin_matches("http://localhost:*", "https://localhost:3000"));
        assert!(origin_matches("https://app.example", "https://app.example"));
        assert!(!origin_matches("https://app.example", "https://app.example:8443"));
        assert!(!origin_matches("http://127.0.0.1:*", "null"));
    }

    #[test]
    fn bearer_schemes_are_case_insensitive() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer abc"), Some("abc"));
        assert_eq!(bearer_token("BEARER a b"), Some("a b"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer"), None);
    }

    #[test]
    fn json_content_types() {
        assert!(is_json("application/json"));
        assert!(is_json("Application/JSON; charset=utf-8"));
        assert!(!is_json("text/plain"));
        assert!(!is_json("application/jsonp"));
    }

    #[test]
    fn host_names_lose_their_port() {
        assert_eq!(host_name("127.0.0.1:8750"), "127.0.0.1");
        assert_eq!(host_name("localhost"), "localhost");
        assert_eq!(host_name("[::1]:8750"), "[::1]");
        assert_eq!(host_name("evil.example:80"), "evil.example");
        assert_eq!(host_name("weird:"), "weird:");
    }

    #[test]
    fn cookie_values_round_trip() {
        assert_eq!(hex(b"a; b"), "613b2062");
        assert_eq!(unhex("613b2062").as_deref(), Some(&b"a; b"[..]));
        assert_eq!(unhex("613"), None);
        assert_eq!(unhex("zz"), None);
    }

    #[test]
    fn query_values_decode() {
        assert_eq!(percent_decode("a%2Bb+c").as_deref(), Some("a+b c"));
        assert_eq!(percent_decode("plain").as_deref(), Some("plain"));
        assert_eq!(percent_decode("bad%2"), None);
        assert_eq!(percent_decode("bad%zz"), None);
    }

    #[test]
    fn token_comparison_is_exact() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"secret"));
        assert!(!constant_time_eq(b"secret", b""));
    }
}
