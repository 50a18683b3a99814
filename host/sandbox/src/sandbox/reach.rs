//! `toolsmith:tool/capabilities`: the only ways out of the sandbox, each checked against what an
//! operator granted the calling tool ([`Grants`]).
//!
//! Outgoing HTTP is a host function rather than `wasi:http`: the host makes the request itself,
//! so one place checks every hop (scheme, host, port and method against the allow-list, the
//! addresses DNS returns, redirects, the call's budget and deadline), and a refusal comes back as
//! a `tool-error` naming the capability instead of `wasi:http`'s bare `HTTP-request-denied`. It
//! also keeps the sandbox's linker synchronous (wasmtime's `wasi:http` host is async) and tools
//! small: a guest needs no HTTP stack of its own.
//!
//! Secrets are read at call time from where the grant points (an environment variable or a
//! file); the values handed out during a call are remembered and scrubbed from everything the
//! call returns: result, error, logs.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use toolsmith_contract::capabilities::Grants;
use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::DefaultConnector;

use super::bindings::toolsmith::tool::capabilities::{HttpRequest, HttpResponse};
use super::bindings::toolsmith::tool::types::ToolError;

/// The `code` of a refused capability, which the host also turns into the call's
/// `permission_denied` failure when the tool gives up on it.
pub const PERMISSION_DENIED: &str = "permission_denied";

/// Per-call limits of outgoing HTTP (the tool's deadline bounds it too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// Requests per call, redirect hops included. By default this is 16.
    pub max_requests: u32,
    /// Bytes of response bodies per call, all requests together. By default this is 4 MiB.
    pub max_response_bytes: u64,
    /// Bytes of one request body. By default this is 1 MiB.
    pub max_request_bytes: usize,
    /// Time to open a connection (within what is left of the deadline). By default this is 5 s.
    pub connect_timeout: Duration,
    /// Redirects followed per request, each hop checked against the grants. By default this is 5.
    pub max_redirects: u32,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_requests: 16,
            max_response_bytes: 4 << 20,
            max_request_bytes: 1 << 20,
            connect_timeout: Duration::from_secs(5),
            max_redirects: 5,
        }
    }
}

/// The two HTTP agents of a process (public addresses only, or private ones too), built on first
/// use so pure tools never pay for TLS set-up.
#[derive(Debug, Default)]
pub(crate) struct Agents {
    roots: Option<Vec<ureq::tls::Certificate<'static>>>,
    public: OnceLock<ureq::Agent>,
    private: OnceLock<ureq::Agent>,
}

impl Agents {
    /// `roots` replaces the built-in Mozilla roots when given (PEM certificates).
    pub(crate) fn new(roots_pem: Option<&[u8]>) -> Result<Agents, String> {
        let roots = match roots_pem {
            None => None,
            Some(pem) => {
                let certs: Vec<_> = ureq::tls::parse_pem(pem)
                    .filter_map(|item| match item {
                        Ok(ureq::tls::PemItem::Certificate(c)) => Some(Ok(c)),
                        Ok(_) => None,
                        Err(e) => Some(Err(e.to_string())),
                    })
                    .collect::<Result<_, _>>()?;
                if certs.is_empty() {
                    return Err("the CA file holds no PEM certificate".into());
                }
                Some(certs)
            }
        };
        Ok(Agents { roots, ..Agents::default() })
    }

    fn get(&self, allow_private: bool) -> &ureq::Agent {
        let cell = if allow_private { &self.private } else { &self.public };
        cell.get_or_init(|| {
            let mut tls = ureq::tls::TlsConfig::builder();
            if let Some(roots) = &self.roots {
                tls = tls.root_certs(ureq::tls::RootCerts::new_with_certs(roots));
            }
            let config = ureq::Agent::config_builder()
                // Redirects are followed here, each hop checked; a proxy from the environment
                // would send granted requests somewhere no grant names.
                .max_redirects(0)
                .proxy(None)
                .http_status_as_error(false)
                .user_agent("toolsmith-sandbox")
                .tls_config(tls.build())
                .build();
            ureq::Agent::with_parts(config, DefaultConnector::default(), Checked { allow_private })
        })
    }
}

/// Resolves names as usual, then drops every address that is not public unless the grant allows
/// private ones: the addresses checked are the ones connected to, so a name cannot pass the check
/// and then resolve somewhere else (DNS rebinding).
#[derive(Debug)]
struct Checked {
    allow_private: bool,
}

/// The marker a refused resolution carries through ureq's error.
const PRIVATE_REFUSED: &str = "resolves only to private addresses";

impl Resolver for Checked {
    fn resolve(
        &self,
        uri: &ureq::http::Uri,
        config: &ureq::config::Config,
        timeout: ureq::unversioned::transport::NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        // An address literal needs no lookup (ureq's resolver would spawn a thread to bound it).
        let literal =
            uri.host().map(|h| h.trim_start_matches('[').trim_end_matches(']')).and_then(|h| h.parse::<IpAddr>().ok());
        let found = match literal {
            Some(ip) => {
                let https = uri.scheme_str() == Some("https");
                let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
                let mut one = self.empty();
                one.push(std::net::SocketAddr::new(ip, port));
                one
            }
            None => DefaultResolver::default().resolve(uri, config, timeout)?,
        };
        if self.allow_private {
            return Ok(found);
        }
        let mut kept = self.empty();
        for addr in found.iter().filter(|a| is_public(a.ip())) {
            kept.push(*addr);
        }
        if kept.is_empty() {
            return Err(ureq::Error::Io(io::Error::new(io::ErrorKind::PermissionDenied, PRIVATE_REFUSED)));
        }
        Ok(kept)
    }
}

/// Whether `ip` is a public unicast address: not loopback, private (RFC 1918, unique local),
/// link-local, shared (CGNAT), documentation, benchmarking, multicast, broadcast or unspecified.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => is_public_v4(v4),
            None => is_public_v6(v6),
        },
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_documentation()
        || ip.is_multicast()
        || a == 0
        || (a == 100 && (64..128).contains(&b))
        || (a == 198 && (b == 18 || b == 19))
        || a >= 240)
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let first = ip.segments()[0];
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || (first & 0xfe00) == 0xfc00
        || (first & 0xffc0) == 0xfe80
        || (first == 0x2001 && ip.segments()[1] == 0x0db8))
}

/// The grants of a tool granted nothing, shared by every pure call.
pub(crate) fn nothing() -> Arc<Grants> {
    static NOTHING: OnceLock<Arc<Grants>> = OnceLock::new();
    NOTHING.get_or_init(Arc::default).clone()
}

/// What one call may reach and what it has used so far.
#[derive(Debug)]
pub(crate) struct Reach {
    pub(crate) tool: String,
    pub(crate) grants: Arc<Grants>,
    pub(crate) limits: HttpLimits,
    pub(crate) requests: u32,
    pub(crate) response_bytes: u64,
    /// Secret values handed to the tool during this call, scrubbed from what it returns.
    pub(crate) revealed: Vec<String>,
    /// The capability last refused, so a call that fails after a refusal is `permission_denied`.
    pub(crate) denied: Option<String>,
}

fn tool_error(code: &str, message: impl Into<String>) -> ToolError {
    ToolError { code: code.to_owned(), message: message.into() }
}

impl Reach {
    pub(crate) fn new(tool: &str, grants: Arc<Grants>, limits: HttpLimits) -> Reach {
        Reach {
            tool: tool.to_owned(),
            grants,
            limits,
            requests: 0,
            response_bytes: 0,
            revealed: Vec::new(),
            denied: None,
        }
    }

    fn deny(&mut self, capability: String, message: String) -> ToolError {
        tracing::info!(tool = %self.tool, %capability, "capability refused");
        self.denied = Some(capability);
        tool_error(PERMISSION_DENIED, message)
    }

    /// The host's `secret` function.
    pub(crate) fn secret(&mut self, name: &str) -> Result<String, ToolError> {
        let Some(grant) = self.grants.secrets.iter().find(|s| s.name == name) else {
            let message = format!(
                "secret `{name}` is not granted to `{0}`; an operator grants it with `toolsmith tools grant {0} --secret {name}=env:VARIABLE`",
                self.tool
            );
            return Err(self.deny(format!("secret:{name}"), message));
        };
        let value = grant.source.read().map_err(|why| {
            tool_error("secret_unavailable", format!("secret `{name}` is granted but cannot be read: {why}"))
        })?;
        if !value.is_empty() && !self.revealed.contains(&value) {
            self.revealed.push(value.clone());
        }
        Ok(value)
    }

    /// The host's `http` function: one request, redirects followed with each hop checked.
    pub(crate) fn http(
        &mut self,
        agents: &Agents,
        deadline: Instant,
        request: HttpRequest,
    ) -> Result<HttpResponse, ToolError> {
        let mut method = request.method.to_ascii_uppercase();
        if method.is_empty() || !method.bytes().all(|b| b.is_ascii_alphabetic()) {
            return Err(tool_error("invalid_request", format!("`{}` is not an HTTP method", request.method)));
        }
        if request.body.len() > self.limits.max_request_bytes {
            return Err(tool_error(
                "request_too_large",
                format!(
                    "the request body is {} bytes; the cap is {}",
                    request.body.len(),
                    self.limits.max_request_bytes
                ),
            ));
        }
        for (name, _) in &request.headers {
            // The host header names the virtual host: a tool must not reach a host other than the
            // one its URL (and grant) names by setting it.
            if name.eq_ignore_ascii_case("host") || name.to_ascii_lowercase().starts_with("proxy-") {
                return Err(tool_error("invalid_request", format!("the `{name}` header is set by the host")));
            }
        }
        let mut url = url::Url::parse(&request.url)
            .map_err(|e| tool_error("invalid_request", format!("`{}` is not a URL: {e}", request.url)))?;
        let mut headers = request.headers;
        let mut body = request.body;
        for hop in 0..=self.limits.max_redirects {
            let target = self.check(&url, &method)?;
            if self.requests >= self.limits.max_requests {
                return Err(tool_error(
                    "limit_exceeded",
                    format!("the call made {} HTTP requests, its limit", self.limits.max_requests),
                ));
            }
            self.requests += 1;
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(tool_error("timeout", "the call's deadline passed before the request"));
            }
            let response = self.send(agents.get(target.allow_private), &url, &method, &headers, &body, remaining)?;
            let status = response.status().as_u16();
            let location = response.headers().get("location").and_then(|l| l.to_str().ok()).map(str::to_owned);
            if let (300..=399, Some(location)) = (status, location)
                && hop < self.limits.max_redirects
            {
                let next = url.join(&location).map_err(|e| {
                    tool_error("http_error", format!("the server redirected to `{location}`, not a URL: {e}"))
                })?;
                if next.host_str() != url.host_str() || next.port_or_known_default() != url.port_or_known_default() {
                    // Credentials meant for one host are not sent to another.
                    headers.retain(|(n, _)| {
                        !["authorization", "cookie"].iter().any(|s| n.eq_ignore_ascii_case(s))
                            && !n.to_ascii_lowercase().starts_with("x-api")
                    });
                }
                if status == 303 || ((status == 301 || status == 302) && method == "POST") {
                    method = "GET".into();
                    body.clear();
                }
                url = next;
                continue;
            }
            return self.read(response, status);
        }
        Err(tool_error("http_error", format!("more than {} redirects", self.limits.max_redirects)))
    }

    /// The grant that lets `method` reach `url`, or the refusal naming what is missing.
    fn check(
        &mut self,
        url: &url::Url,
        method: &str,
    ) -> Result<toolsmith_contract::capabilities::HttpGrant, ToolError> {
        let scheme = url.scheme().to_owned();
        let host = match url.host() {
            Some(url::Host::Domain(d)) => d.to_ascii_lowercase(),
            Some(url::Host::Ipv4(ip)) => ip.to_string(),
            Some(url::Host::Ipv6(ip)) => ip.to_string(),
            None => return Err(tool_error("invalid_request", format!("`{url}` has no host"))),
        };
        let port = url.port_or_known_default().unwrap_or(0);
        if scheme != "http" && scheme != "https" {
            return Err(tool_error("invalid_request", format!("only http and https URLs are fetched, not `{scheme}`")));
        }
        if let Some(grant) = self.grants.http.iter().find(|g| g.allows(&scheme, &host, port, method)) {
            return Ok(grant.clone());
        }
        let shown = if host.contains(':') { format!("[{host}]") } else { host.clone() };
        let capability = format!("http:{scheme}://{shown}:{port}");
        let message = if self.grants.http.iter().any(|g| g.pattern.matches(&scheme, &host, port)) {
            format!("`{method}` to {scheme}://{shown}:{port} is not granted to `{}` (other methods are)", self.tool)
        } else {
            format!(
                "{scheme}://{shown}:{port} is not granted to `{0}`; an operator grants it with `toolsmith tools grant {0} --http {scheme}://{shown}:{port}`",
                self.tool
            )
        };
        Err(self.deny(capability, message))
    }

    fn send(
        &mut self,
        agent: &ureq::Agent,
        url: &url::Url,
        method: &str,
        headers: &[(String, String)],
        body: &[u8],
        remaining: Duration,
    ) -> Result<ureq::http::Response<ureq::Body>, ToolError> {
        let mut builder = ureq::http::Request::builder().method(method).uri(url.as_str());
        for (name, value) in headers {
            builder = builder.header(name.as_str(), value.as_str());
        }
        let request = builder
            .body(body.to_vec())
            .map_err(|e| tool_error("invalid_request", format!("cannot build the request: {e}")))?;
        let request = agent
            .configure_request(request)
            .timeout_global(Some(remaining))
            .timeout_connect(Some(self.limits.connect_timeout.min(remaining)))
            .build();
        agent.run(request).map_err(|e| self.failure(url, e))
    }

    fn read(&mut self, mut response: ureq::http::Response<ureq::Body>, status: u16) -> Result<HttpResponse, ToolError> {
        let headers = response
            .headers()
            .iter()
            .filter_map(|(n, v)| v.to_str().ok().map(|v| (n.as_str().to_owned(), v.to_owned())))
            .collect();
        let room = self.limits.max_response_bytes.saturating_sub(self.response_bytes);
        let body = response.body_mut().with_config().limit(room).read_to_vec().map_err(|e| match e {
            ureq::Error::BodyExceedsLimit(_) => tool_error(
                "response_too_large",
                format!(
                    "the response bodies of this call passed {} bytes, its cap; ask the server for less",
                    self.limits.max_response_bytes
                ),
            ),
            ureq::Error::Timeout(_) => tool_error("timeout", "the call's deadline passed while reading the response"),
            other => tool_error("http_error", format!("reading the response failed: {other}")),
        })?;
        self.response_bytes += body.len() as u64;
        Ok(HttpResponse { status, headers, body })
    }

    fn failure(&mut self, url: &url::Url, error: ureq::Error) -> ToolError {
        let host = url.host_str().unwrap_or("?").to_owned();
        match error {
            ureq::Error::Io(e) if e.kind() == io::ErrorKind::PermissionDenied && e.to_string() == PRIVATE_REFUSED => {
                let message = format!(
                    "{host} resolves only to private addresses, which `{0}` may not reach; an operator allows them with `toolsmith tools grant {0} --http ... --private`",
                    self.tool
                );
                self.deny(format!("http:{}:private", host), message)
            }
            ureq::Error::Timeout(_) => {
                tool_error("timeout", format!("{host} did not answer within the call's deadline"))
            }
            ureq::Error::HostNotFound => tool_error("http_error", format!("cannot resolve {host}")),
            other => tool_error("http_error", format!("the request to {host} failed: {other}")),
        }
    }

    /// Replaces every secret value handed out in this call with `[redacted]` in `text`, in its
    /// raw and its JSON-escaped form.
    pub(crate) fn scrub(&self, text: &mut String) {
        for value in &self.revealed {
            // One or two characters would erase ordinary text; such a "secret" protects nothing.
            if value.len() < 4 {
                continue;
            }
            if text.contains(value.as_str()) {
                *text = text.replace(value.as_str(), "[redacted]");
            }
            let escaped = serde_json::to_string(value).unwrap_or_default();
            let escaped = escaped.trim_matches('"');
            if escaped != value && text.contains(escaped) {
                *text = text.replace(escaped, "[redacted]");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_public_unicast_addresses_count_as_public() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:10.0.0.1",
            "198.18.0.1",
            "224.0.0.1",
        ] {
            assert!(!is_public(private.parse().expect("an address")), "{private}");
        }
        for public in ["1.1.1.1", "93.184.216.34", "2606:4700::1111", "::ffff:8.8.8.8"] {
            assert!(is_public(public.parse().expect("an address")), "{public}");
        }
    }

    #[test]
    fn scrubbing_removes_raw_and_json_escaped_secret_values() {
        let mut reach = Reach::new("t", Arc::default(), HttpLimits::default());
        reach.revealed.push("s3cr\"et-value".into());
        let mut text = r#"{"echo": "s3cr\"et-value", "raw": s3cr"et-value}"#.to_owned();
        reach.scrub(&mut text);
        assert!(!text.contains("et-value"), "{text}");
        assert_eq!(text.matches("[redacted]").count(), 2);
    }
}
