//! Capabilities: what a tool may reach beyond pure computation, declared by its author and granted
//! by an operator.
//!
//! A tool is pure by default: no network, no files, no environment. Its manifest may *declare*
//! [`Capabilities`] (hosts it calls, directories it reads by logical name, secrets and environment
//! variables it needs); declaring grants nothing. An operator *grants* them per tool
//! ([`Grants`], stored in the registry by `toolsmith tools grant`), and only granted capabilities
//! exist inside the sandbox for that tool's calls.

use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What a tool's manifest asks for. Nothing here is granted by being declared.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Capabilities {
    /// Hosts the tool makes HTTP requests to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub http: Vec<HttpCapability>,
    /// Directories the tool reads, by logical name; the operator picks the real directory.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dirs: Vec<NamedCapability>,
    /// Secrets the tool reads with the host's `secret` function (API keys, tokens).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<NamedCapability>,
    /// Environment variables the tool reads (values come from the operator's environment).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<NamedCapability>,
}

impl Capabilities {
    /// True when the tool declares nothing: a pure tool.
    pub fn is_empty(&self) -> bool {
        self.http.is_empty() && self.dirs.is_empty() && self.secrets.is_empty() && self.env.is_empty()
    }
}

/// One host a tool calls over HTTP.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpCapability {
    /// A host pattern: `api.example.com`, `*.example.com`, optionally with a scheme and port
    /// (`https://api.example.com:8443`). See [`HostPattern`].
    pub host: String,
    /// Methods the tool uses, upper case. Empty means `GET` and `HEAD`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    /// Why the tool needs it, shown to the operator who grants it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// A directory, secret or environment variable a tool asks for by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NamedCapability {
    /// The name: a directory's logical name (`docs`), a secret's name (`weather_api_key`), an
    /// environment variable (`LANG`).
    pub name: String,
    /// Why the tool needs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// What an operator granted one tool. Empty means pure computation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grants {
    /// Hosts the tool may call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub http: Vec<HttpGrant>,
    /// Directories mounted read-only at `/dirs/<name>` inside the sandbox.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dirs: Vec<DirGrant>,
    /// Secrets the tool may read, by where their values live (never the values themselves).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<SecretGrant>,
    /// Environment variables passed through from the host's environment, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
}

impl Grants {
    /// True when nothing is granted.
    pub fn is_empty(&self) -> bool {
        self.http.is_empty() && self.dirs.is_empty() && self.secrets.is_empty() && self.env.is_empty()
    }

    /// Every grant, one item each: http, then directories, secrets, environment variables.
    pub fn items(&self) -> Vec<Grant> {
        let http = self.http.iter().cloned().map(Grant::Http);
        let dirs = self.dirs.iter().cloned().map(Grant::Dir);
        let secrets = self.secrets.iter().cloned().map(Grant::Secret);
        let env = self.env.iter().map(|name| Grant::Env { name: name.clone() });
        http.chain(dirs).chain(secrets).chain(env).collect()
    }

    /// Adds one grant.
    pub fn add(&mut self, grant: Grant) {
        match grant {
            Grant::Http(g) => self.http.push(g),
            Grant::Dir(g) => self.dirs.push(g),
            Grant::Secret(g) => self.secrets.push(g),
            Grant::Env { name } => self.env.push(name),
        }
    }
}

/// One granted capability.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Grant {
    /// Outgoing HTTP.
    Http(HttpGrant),
    /// A read-only directory.
    Dir(DirGrant),
    /// A secret, by reference.
    Secret(SecretGrant),
    /// An environment variable, passed through by name.
    Env {
        /// The variable.
        name: String,
    },
}

impl Grant {
    /// The capability's key, unique per tool: `http:https://a.com:443`, `dir:docs`,
    /// `secret:api_key`, `env:LANG`. What `tools show` prints and `tools revoke` takes.
    pub fn key(&self) -> String {
        match self {
            Grant::Http(h) => h.key(),
            Grant::Dir(d) => format!("dir:{}", d.name),
            Grant::Secret(s) => format!("secret:{}", s.name),
            Grant::Env { name } => format!("env:{name}"),
        }
    }

    /// What it allows, in words (a secret's source, never its value).
    pub fn describe(&self) -> String {
        match self {
            Grant::Http(h) => h.to_string(),
            Grant::Dir(d) => format!("{} read-only at /dirs/{}", d.path.display(), d.name),
            Grant::Secret(s) => format!("from {}", s.source),
            Grant::Env { .. } => "from the host's environment".to_owned(),
        }
    }
}

/// Outgoing HTTP to the hosts one pattern matches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpGrant {
    /// Which scheme, host and port.
    pub pattern: HostPattern,
    /// Methods allowed, upper case.
    pub methods: Vec<String>,
    /// Whether the host may resolve to a loopback, private, link-local or otherwise
    /// non-public address (refused by default, so a granted name cannot be pointed at the
    /// operator's own network by its DNS).
    #[serde(default)]
    pub allow_private: bool,
}

impl HttpGrant {
    /// The capability key, e.g. `http:https://api.example.com:443`.
    pub fn key(&self) -> String {
        format!("http:{}", self.pattern)
    }

    /// Whether this grant lets `method` reach `scheme://host:port`.
    pub fn allows(&self, scheme: &str, host: &str, port: u16, method: &str) -> bool {
        self.pattern.matches(scheme, host, port) && self.methods.iter().any(|m| m.eq_ignore_ascii_case(method))
    }
}

impl fmt::Display for HttpGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.methods.join(","), self.pattern)?;
        if self.allow_private {
            f.write_str(" (private addresses allowed)")?;
        }
        Ok(())
    }
}

/// `scheme://host:port` where `host` is exact (`api.example.com`, `127.0.0.1`) or a wildcard over
/// subdomains (`*.example.com`, which does not match `example.com` itself).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct HostPattern {
    /// `http` or `https`.
    pub scheme: String,
    /// Lower-case host name or IP address; a leading `*.` matches any subdomain.
    pub host: String,
    /// The port; the scheme's default when the pattern names none.
    pub port: u16,
}

impl HostPattern {
    /// Parses `[scheme://]host[:port]`; the scheme defaults to `https`.
    pub fn parse(text: &str) -> Result<HostPattern, CapabilityError> {
        let bad = |why: &str| CapabilityError::BadHost { pattern: text.to_owned(), why: why.to_owned() };
        let text_trim = text.trim().trim_end_matches('/');
        let (scheme, rest) = match text_trim.split_once("://") {
            Some((s, r)) => (s.to_ascii_lowercase(), r),
            None => ("https".to_owned(), text_trim),
        };
        let default_port = match scheme.as_str() {
            "https" => 443,
            "http" => 80,
            _ => return Err(bad("the scheme must be http or https")),
        };
        if rest.contains('/') || rest.contains('@') || rest.contains('?') {
            return Err(bad("give a host, not a URL path or user"));
        }
        let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
            let (addr, after) = v6.split_once(']').ok_or_else(|| bad("unclosed `[`"))?;
            let port = match after.strip_prefix(':') {
                Some(p) => p.parse().map_err(|_| bad("the port is not a number"))?,
                None if after.is_empty() => default_port,
                None => return Err(bad("unexpected text after `]`")),
            };
            (addr.to_owned(), port)
        } else {
            match rest.rsplit_once(':') {
                Some((h, p)) => (h.to_owned(), p.parse().map_err(|_| bad("the port is not a number"))?),
                None => (rest.to_owned(), default_port),
            }
        };
        let host = host.to_ascii_lowercase();
        let name = host.strip_prefix("*.").unwrap_or(&host);
        let label_ok = |l: &str| !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
        if host.parse::<IpAddr>().is_err() && (name.is_empty() || !name.split('.').all(label_ok)) {
            return Err(bad("not a host name (letters, digits, `-` and `.`, optionally after `*.`)"));
        }
        if port == 0 {
            return Err(bad("port 0 is not a port"));
        }
        Ok(HostPattern { scheme, host, port })
    }

    /// Whether `scheme://host:port` (host lower case) is one this pattern names.
    pub fn matches(&self, scheme: &str, host: &str, port: u16) -> bool {
        if !self.scheme.eq_ignore_ascii_case(scheme) || self.port != port {
            return false;
        }
        let host = host.trim_end_matches('.');
        match self.host.strip_prefix("*.") {
            Some(suffix) => {
                host.len() > suffix.len() + 1
                    && host.ends_with(suffix)
                    && host.as_bytes()[host.len() - suffix.len() - 1] == b'.'
            }
            None => self.host.eq_ignore_ascii_case(host),
        }
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = if self.host.contains(':') { format!("[{}]", self.host) } else { self.host.clone() };
        write!(f, "{}://{}:{}", self.scheme, host, self.port)
    }
}

impl TryFrom<String> for HostPattern {
    type Error = CapabilityError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        HostPattern::parse(&value)
    }
}

impl From<HostPattern> for String {
    fn from(value: HostPattern) -> Self {
        value.to_string()
    }
}

/// A directory mounted read-only for one tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirGrant {
    /// The logical name: the tool sees the directory at `/dirs/<name>`.
    pub name: String,
    /// The directory on the host (absolute, canonical when granted).
    pub path: PathBuf,
}

/// A secret a tool may read, by where its value lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretGrant {
    /// The name the tool asks for.
    pub name: String,
    /// Where the value is read at call time.
    pub source: SecretSource,
}

/// Where a secret's value lives. The registry stores this reference, never the value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SecretSource {
    /// An environment variable of the process that runs the tool.
    Env(String),
    /// A file (its contents, without a trailing newline).
    File(PathBuf),
}

impl SecretSource {
    /// Parses `env:VAR` or `file:PATH`.
    pub fn parse(text: &str) -> Result<SecretSource, CapabilityError> {
        match text.split_once(':') {
            Some(("env", var)) if !var.is_empty() => Ok(SecretSource::Env(var.to_owned())),
            Some(("file", path)) if !path.is_empty() => Ok(SecretSource::File(PathBuf::from(path))),
            _ => Err(CapabilityError::BadSecretSource { source_text: text.to_owned() }),
        }
    }

    /// Reads the value now.
    pub fn read(&self) -> Result<String, String> {
        match self {
            SecretSource::Env(var) => {
                std::env::var(var).map_err(|_| format!("the environment variable `{var}` is not set"))
            }
            SecretSource::File(path) => std::fs::read_to_string(path)
                .map(|s| s.trim_end_matches(['\r', '\n']).to_owned())
                .map_err(|e| format!("cannot read {}: {e}", path.display())),
        }
    }
}

impl fmt::Display for SecretSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretSource::Env(var) => write!(f, "env:{var}"),
            SecretSource::File(path) => write!(f, "file:{}", path.display()),
        }
    }
}

/// A capability that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CapabilityError {
    /// A host pattern that is not `[scheme://]host[:port]`.
    #[error("bad host pattern `{pattern}`: {why}")]
    BadHost {
        /// The pattern as given.
        pattern: String,
        /// What is wrong with it.
        why: String,
    },
    /// A secret source that is not `env:VAR` or `file:PATH`.
    #[error("bad secret source `{source_text}`: write env:VARIABLE or file:PATH")]
    BadSecretSource {
        /// The source as given.
        source_text: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_patterns_parse_with_defaults_and_match_exactly_or_by_subdomain() {
        let p = HostPattern::parse("api.example.com").expect("parses");
        assert_eq!(p.to_string(), "https://api.example.com:443");
        assert!(p.matches("https", "api.example.com", 443));
        assert!(!p.matches("http", "api.example.com", 443), "scheme is part of the grant");
        assert!(!p.matches("https", "api.example.com", 8443), "port is part of the grant");
        assert!(!p.matches("https", "evil-api.example.com", 443));

        let w = HostPattern::parse("http://*.Example.org:8080").expect("parses");
        assert!(w.matches("http", "a.example.org", 8080));
        assert!(w.matches("http", "a.b.example.org", 8080));
        assert!(!w.matches("http", "example.org", 8080), "a wildcard names subdomains only");
        assert!(!w.matches("http", "badexample.org", 8080));

        let ip = HostPattern::parse("http://127.0.0.1:9000").expect("parses");
        assert!(ip.matches("http", "127.0.0.1", 9000));
        let v6 = HostPattern::parse("http://[::1]:9000").expect("parses");
        assert_eq!(v6.to_string(), "http://[::1]:9000");
        assert!(v6.matches("http", "::1", 9000));

        for bad in ["ftp://a.com", "a.com/path", "user@a.com", "a.com:x", "*.", "a..b", "a.com:0", ""] {
            assert!(HostPattern::parse(bad).is_err(), "{bad} should not parse");
        }
    }

    #[test]
    fn secret_sources_name_where_the_value_is_without_holding_it() {
        assert_eq!(SecretSource::parse("env:KEY").expect("parses"), SecretSource::Env("KEY".into()));
        assert_eq!(SecretSource::parse("file:/run/k").expect("parses").to_string(), "file:/run/k");
        assert!(SecretSource::parse("plain-value").is_err());
        assert!(SecretSource::parse("env:").is_err());
    }
}
