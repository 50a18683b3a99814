//! `toolsmith tools grant|revoke`: an operator's capability grants, per tool.

use anyhow::{Context, Result, bail};
use clap::Args;
use toolsmith_contract::capabilities::{DirGrant, Grants, HostPattern, HttpGrant, SecretGrant, SecretSource};
use toolsmith_registry::Registry;

/// What to grant one tool.
#[derive(Debug, Args)]
pub struct GrantArgs {
    /// The tool.
    pub name: String,
    /// Outgoing HTTP to `[scheme://]host[:port]`: an exact host or `*.example.com` (subdomains);
    /// the scheme defaults to https, the port to the scheme's.
    #[arg(long, value_name = "HOST")]
    pub http: Vec<String>,
    /// Methods the --http grants allow (repeatable). By default those the tool's manifest
    /// declares for the host, else GET and HEAD.
    #[arg(long = "method", value_name = "METHOD", requires = "http")]
    pub methods: Vec<String>,
    /// Let the --http hosts resolve to loopback or private addresses (refused by default, so DNS
    /// cannot point a granted name at the operator's own network).
    #[arg(long, requires = "http")]
    pub private: bool,
    /// A directory mounted read-only at `/dirs/NAME`: `NAME=PATH`.
    #[arg(long, value_name = "NAME=PATH")]
    pub dir: Vec<String>,
    /// A secret the tool reads by name: `NAME=env:VARIABLE` or `NAME=file:PATH`. Only the
    /// reference is stored; the value is read when the tool runs.
    #[arg(long, value_name = "NAME=SOURCE")]
    pub secret: Vec<String>,
    /// An environment variable passed through from the environment the tool runs in.
    #[arg(long, value_name = "VARIABLE")]
    pub env: Vec<String>,
    /// Who is granting, for the log. By default `$USER`.
    #[arg(long, value_name = "WHO")]
    pub by: Option<String>,
}

/// What to revoke.
#[derive(Debug, Args)]
pub struct RevokeArgs {
    /// The tool.
    pub name: String,
    /// Capabilities as `tools show` lists them (`http:https://api.example.com:443`, `dir:docs`,
    /// `secret:key`, `env:LANG`).
    #[arg(value_name = "CAPABILITY", required_unless_present = "all")]
    pub capabilities: Vec<String>,
    /// Revoke everything the tool holds.
    #[arg(long, conflicts_with = "capabilities")]
    pub all: bool,
    /// Who is revoking, for the log. By default `$USER`.
    #[arg(long, value_name = "WHO")]
    pub by: Option<String>,
}

fn actor(by: Option<String>) -> String {
    by.or_else(|| std::env::var("USER").ok()).filter(|s| !s.trim().is_empty()).unwrap_or_else(|| "unknown".into())
}

fn is_plain_name(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
}

/// Parses the flags into grants, checking what can be checked now (patterns, directories).
pub fn parse(r: &Registry, args: &GrantArgs) -> Result<Grants> {
    let record = r.get(&args.name)?;
    let declared = &record.manifest.capabilities;
    let mut grants = Grants::default();
    for text in &args.http {
        let pattern = HostPattern::parse(text)?;
        let mut methods: Vec<String> = args.methods.iter().map(|m| m.trim().to_ascii_uppercase()).collect();
        if methods.is_empty() {
            methods = declared
                .http
                .iter()
                .filter(|d| declares(d, &pattern.host))
                .flat_map(|d| d.methods.iter().map(|m| m.to_ascii_uppercase()))
                .collect();
        }
        if methods.is_empty() {
            methods = vec!["GET".into(), "HEAD".into()];
        }
        methods.sort();
        methods.dedup();
        if let Some(bad) = methods.iter().find(|m| m.is_empty() || !m.bytes().all(|b| b.is_ascii_alphabetic())) {
            bail!("`{bad}` is not an HTTP method");
        }
        grants.http.push(HttpGrant { pattern, methods, allow_private: args.private });
    }
    for text in &args.dir {
        let (name, path) = text.split_once('=').with_context(|| format!("--dir {text}: write NAME=PATH"))?;
        if !is_plain_name(name) {
            bail!("--dir {text}: the name `{name}` must be letters, digits, `_`, `-` or `.`");
        }
        let path = std::fs::canonicalize(path).with_context(|| format!("--dir {text}: cannot open {path}"))?;
        if !path.is_dir() {
            bail!("--dir {text}: {} is not a directory", path.display());
        }
        grants.dirs.push(DirGrant { name: name.to_owned(), path });
    }
    for text in &args.secret {
        let (name, source) = text
            .split_once('=')
            .with_context(|| format!("--secret {text}: write NAME=env:VARIABLE or NAME=file:PATH"))?;
        if !is_plain_name(name) {
            bail!("--secret: the name `{name}` must be letters, digits, `_`, `-` or `.`");
        }
        let source = SecretSource::parse(source)?;
        if let SecretSource::File(path) = &source
            && !path.is_absolute()
        {
            bail!("--secret {name}=file:{}: give an absolute path", path.display());
        }
        if let Err(why) = source.read() {
            eprintln!("note: secret `{name}` cannot be read here now ({why}); calls will fail until it can");
        }
        grants.secrets.push(SecretGrant { name: name.to_owned(), source });
    }
    for var in &args.env {
        if var.is_empty() || var.contains('=') || var.contains('\0') {
            bail!("--env {var}: give a variable's name");
        }
        grants.env.push(var.clone());
    }
    if grants.is_empty() {
        bail!("nothing to grant: give --http, --dir, --secret or --env");
    }
    undeclared_notes(declared, &grants, &args.name);
    Ok(grants)
}

/// Whether a declared HTTP capability covers `host` (`*` covers any host the operator grants).
fn declares(declared: &toolsmith_contract::capabilities::HttpCapability, host: &str) -> bool {
    declared.host == "*" || HostPattern::parse(&declared.host).is_ok_and(|p| p.host == host)
}

/// A grant beyond what the manifest declares is allowed (an operator may know better, and
/// agent-written Python tools declare nothing) but worth a second look.
fn undeclared_notes(declared: &toolsmith_contract::Capabilities, grants: &Grants, tool: &str) {
    let named = |list: &[toolsmith_contract::capabilities::NamedCapability], name: &str| {
        list.iter().any(|c| c.name == name || c.name == "*")
    };
    for h in &grants.http {
        if !declared.http.iter().any(|d| declares(d, &h.pattern.host)) {
            eprintln!("note: `{tool}` does not declare http to {}; granting it anyway", h.pattern.host);
        }
    }
    for d in &grants.dirs {
        if !named(&declared.dirs, &d.name) {
            eprintln!("note: `{tool}` does not declare a directory `{}`; granting it anyway", d.name);
        }
    }
    for s in &grants.secrets {
        if !named(&declared.secrets, &s.name) {
            eprintln!("note: `{tool}` does not declare a secret `{}`; granting it anyway", s.name);
        }
    }
    for e in &grants.env {
        if !named(&declared.env, e) {
            eprintln!("note: `{tool}` does not declare the variable `{e}`; granting it anyway");
        }
    }
}

/// `tools grant`.
pub fn grant(r: &mut Registry, args: GrantArgs) -> Result<()> {
    let grants = parse(r, &args)?;
    let by = actor(args.by);
    for key in r.grant(&args.name, &grants, &by)? {
        println!("granted {key} to `{}`", args.name);
    }
    Ok(())
}

/// `tools revoke`.
pub fn revoke(r: &mut Registry, args: RevokeArgs) -> Result<()> {
    let by = actor(args.by);
    let revoked = r.revoke(&args.name, &args.capabilities, &by)?;
    if revoked.is_empty() {
        println!("`{}` held no grants", args.name);
    }
    for key in revoked {
        println!("revoked {key} from `{}`", args.name);
    }
    Ok(())
}
