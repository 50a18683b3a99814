//! Capability grants against real servers on loopback: plain HTTP and TLS with a test CA, the
//! bundled `http_get` plugin as the granted tool, and Python tools for directories and escapes.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolsmith_contract::capabilities::{DirGrant, Grants, HostPattern, HttpGrant, SecretGrant, SecretSource};
use toolsmith_sandbox::python::create::PythonTool;
use toolsmith_sandbox::python::{DEFAULT_MEMORY_BYTES, PythonRuntime, default_guest_path};
use toolsmith_sandbox::{ErrorKind, Limits, Sandbox, SandboxConfig, Toolbox};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tls");

/// One answer of the test server: status, content type, body; `None` closes without answering.
fn respond(path: &str, port: u16, headers: &[String]) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let text = || vec![("content-type".to_owned(), "text/plain".to_owned())];
    match path {
        "/hello" => (200, text(), b"hello from the loopback server".to_vec()),
        "/json" => (200, vec![("content-type".into(), "application/json".into())], br#"{"temp": 21}"#.to_vec()),
        "/redirect-in" => (302, vec![("location".into(), "/hello".into())], Vec::new()),
        "/redirect-out" => (302, vec![("location".into(), format!("http://localhost:{port}/hello"))], Vec::new()),
        "/slow" => {
            std::thread::sleep(Duration::from_secs(3));
            (200, text(), b"late".to_vec())
        }
        "/big" => (200, text(), vec![b'x'; 5 << 20]),
        "/echo-auth" => {
            let auth = headers.iter().find(|h| h.to_ascii_lowercase().starts_with("authorization:")).cloned();
            (200, text(), auth.unwrap_or_default().into_bytes())
        }
        _ => (404, text(), b"no such page".to_vec()),
    }
}

fn serve_one(mut stream: impl Read + Write, port: u16) {
    let mut reader = BufReader::new(&mut stream);
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        headers.push(line.trim_end().to_owned());
    }
    let path = request_line.split_whitespace().nth(1).unwrap_or("/").to_owned();
    let (status, head, body) = respond(&path, port, &headers);
    let mut out = format!("HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n", body.len());
    for (k, v) in head {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    let _ = stream.write_all(out.as_bytes());
    let _ = stream.write_all(&body);
    let _ = stream.flush();
}

/// A plain HTTP server on 127.0.0.1 (a thread per connection), for the life of the test process.
fn http_port() -> u16 {
    static PORT: OnceLock<u16> = OnceLock::new();
    *PORT.get_or_init(|| {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                std::thread::spawn(move || serve_one(stream, port));
            }
        });
        port
    })
}

/// The same server over TLS, with a certificate for `localhost` signed by the test CA.
fn https_port() -> u16 {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    static PORT: OnceLock<u16> = OnceLock::new();
    *PORT.get_or_init(|| {
        let certs = CertificateDer::pem_file_iter(format!("{FIXTURES}/server.pem"))
            .expect("cert file")
            .collect::<Result<Vec<_>, _>>()
            .expect("certs");
        let key = PrivateKeyDer::from_pem_file(format!("{FIXTURES}/server.key")).expect("key");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocols")
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("server config");
        let config = Arc::new(config);
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let config = config.clone();
                std::thread::spawn(move || {
                    let Ok(conn) = rustls::ServerConnection::new(config) else { return };
                    serve_one(rustls::StreamOwned::new(conn, stream), port);
                });
            }
        });
        port
    })
}

/// A toolbox whose sandbox trusts the test CA, with `http_get` and the Python runtime.
fn toolbox() -> &'static Toolbox {
    static TOOLBOX: OnceLock<Toolbox> = OnceLock::new();
    TOOLBOX.get_or_init(|| {
        let ca = std::fs::read(format!("{FIXTURES}/ca.pem")).expect("ca");
        let config =
            SandboxConfig { cache_dir: Some(crate::cache_dir()), http_ca_pem: Some(ca), ..SandboxConfig::default() };
        let sandbox = Sandbox::new(config).expect("sandbox");
        let toolbox = Toolbox::new(sandbox.clone());
        let http_get = toolsmith_bundled::get("http_get").expect("http_get is bundled");
        toolbox.add_component(http_get.component).expect("http_get loads");
        toolbox.set_python(PythonRuntime::load(sandbox, &default_guest_path()).expect("python guest"));
        toolbox
    })
}

fn http_grant(pattern: &str, private: bool) -> HttpGrant {
    HttpGrant {
        pattern: HostPattern::parse(pattern).expect("pattern"),
        methods: vec!["GET".into()],
        allow_private: private,
    }
}

fn fetch(grants: Grants, args: Value, timeout: Duration) -> Result<Value, toolsmith_sandbox::StructuredError> {
    let tool = toolbox().get("http_get").expect("registered").with_grants(grants);
    let limits = Limits { timeout, ..Limits::default() };
    toolbox().call_tool(&tool, &args, limits).map(|out| out.value)
}

fn loopback(private: bool) -> Grants {
    Grants { http: vec![http_grant(&format!("http://127.0.0.1:{}", http_port()), private)], ..Grants::default() }
}

const SECOND: Duration = Duration::from_secs(10);

#[test]
fn a_granted_tool_reaches_its_host_and_an_ungranted_one_cannot() {
    let url = format!("http://127.0.0.1:{}/hello", http_port());
    let out = fetch(loopback(true), json!({"url": url}), SECOND).expect("granted");
    assert_eq!(out["status"], 200);
    assert_eq!(out["text"], "hello from the loopback server");

    let json_url = format!("http://127.0.0.1:{}/json", http_port());
    let out = fetch(loopback(true), json!({"url": json_url}), SECOND).expect("granted");
    assert_eq!(out["json"]["temp"], 21);

    let e = fetch(Grants::default(), json!({"url": url}), SECOND).expect_err("nothing granted");
    assert_eq!(e.kind, ErrorKind::PermissionDenied, "{e:?}");
    assert!(e.message.contains(&format!("http://127.0.0.1:{}", http_port())), "names the capability: {e:?}");
    assert_eq!(e.expected.as_deref(), Some(format!("http:http://127.0.0.1:{}", http_port()).as_str()));

    let other_port = Grants { http: vec![http_grant("http://127.0.0.1:1", true)], ..Grants::default() };
    let e = fetch(other_port, json!({"url": url}), SECOND).expect_err("another port");
    assert_eq!(e.kind, ErrorKind::PermissionDenied);
}

#[test]
fn private_addresses_need_their_own_grant() {
    let url = format!("http://127.0.0.1:{}/hello", http_port());
    let e = fetch(loopback(false), json!({"url": url}), SECOND).expect_err("loopback is private");
    assert_eq!(e.kind, ErrorKind::PermissionDenied, "{e:?}");
    assert!(e.message.contains("private"), "{e:?}");
    // A name granted without --private is refused when DNS answers with a private address.
    let named =
        Grants { http: vec![http_grant(&format!("http://localhost:{}", http_port()), false)], ..Grants::default() };
    let url = format!("http://localhost:{}/hello", http_port());
    let e = fetch(named, json!({"url": url}), SECOND).expect_err("localhost resolves privately");
    assert_eq!(e.kind, ErrorKind::PermissionDenied, "{e:?}");
}

#[test]
fn redirects_are_followed_inside_the_grant_and_refused_outside_it() {
    let base = format!("http://127.0.0.1:{}", http_port());
    let out = fetch(loopback(true), json!({"url": format!("{base}/redirect-in")}), SECOND).expect("same host");
    assert_eq!(out["text"], "hello from the loopback server");
    let e = fetch(loopback(true), json!({"url": format!("{base}/redirect-out")}), SECOND).expect_err("other host");
    assert_eq!(e.kind, ErrorKind::PermissionDenied, "{e:?}");
    assert!(e.message.contains("localhost"), "names the refused hop: {e:?}");
}

#[test]
fn a_slow_server_is_cut_by_the_deadline_and_a_big_body_by_the_cap() {
    let base = format!("http://127.0.0.1:{}", http_port());
    let started = Instant::now();
    let e = fetch(loopback(true), json!({"url": format!("{base}/slow")}), Duration::from_millis(500))
        .expect_err("the server sleeps 3 s");
    assert!(matches!(e.kind, ErrorKind::Timeout | ErrorKind::ToolError), "{e:?}");
    assert!(e.kind == ErrorKind::Timeout || e.code.as_deref() == Some("timeout"), "{e:?}");
    assert!(started.elapsed() < Duration::from_secs(3), "cut before the server answered");

    let e = fetch(loopback(true), json!({"url": format!("{base}/big")}), SECOND).expect_err("5 MiB > 4 MiB");
    assert_eq!(e.code.as_deref(), Some("response_too_large"), "{e:?}");
}

#[test]
fn tls_with_a_trusted_ca_works_and_the_grant_names_the_scheme() {
    let port = https_port();
    let grants = Grants { http: vec![http_grant(&format!("https://localhost:{port}"), true)], ..Grants::default() };
    let out = fetch(grants.clone(), json!({"url": format!("https://localhost:{port}/hello")}), SECOND).expect("tls");
    assert_eq!(out["text"], "hello from the loopback server");
    // The same host over plain http is another capability.
    let e = fetch(grants, json!({"url": format!("http://localhost:{port}/hello")}), SECOND).expect_err("http");
    assert_eq!(e.kind, ErrorKind::PermissionDenied);
}

#[test]
fn a_secret_reaches_the_server_but_never_the_result() {
    let value = "tok-3f9a1c77e2b04d5e";
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("token");
    std::fs::write(&file, format!("{value}\n")).expect("write");
    let mut grants = loopback(true);
    grants.secrets.push(SecretGrant { name: "api_token".into(), source: SecretSource::File(file) });
    let url = format!("http://127.0.0.1:{}/echo-auth", http_port());
    let tool = toolbox().get("http_get").expect("registered").with_grants(grants);
    let out = toolbox()
        .call_tool(&tool, &json!({"url": url, "bearer_secret": "api_token"}), Limits::default())
        .expect("call");
    let text = out.value["text"].as_str().expect("text");
    assert!(text.starts_with("authorization: Bearer"), "the server saw the header: {text}");
    let everything = format!("{} {:?}", out.value, out.report.logs);
    assert!(!everything.contains(value), "the secret leaked: {everything}");
    assert!(everything.contains("[redacted]"));

    let e = toolbox()
        .call_tool(&tool, &json!({"url": url, "bearer_secret": "other"}), Limits::default())
        .expect_err("not granted");
    assert_eq!(e.kind, ErrorKind::PermissionDenied);
    assert_eq!(e.expected.as_deref(), Some("secret:other"));
}

fn python(code: &str, entry: &str, grants: Grants) -> Result<Value, toolsmith_sandbox::StructuredError> {
    let manifest = toolsmith_contract::Manifest {
        name: toolsmith_contract::ToolName::new(entry).expect("name"),
        version: "0.1.0".into(),
        description: "test".into(),
        input_schema: json!({"type": "object"}),
        output_schema: json!({"type": "object"}),
        examples: Vec::new(),
        kind: toolsmith_contract::ToolKind::Python,
        provenance: Default::default(),
        capabilities: Default::default(),
    };
    let tool = PythonTool { manifest, code: code.into(), positional: Vec::new() };
    let tool = toolbox().python_tool(tool).expect("schemas").with_grants(grants);
    let limits = Limits { memory_bytes: DEFAULT_MEMORY_BYTES, ..Limits::default() };
    toolbox().call_tool(&tool, &json!({}), limits).map(|out| out.value["result"].clone())
}

fn docs() -> (tempfile::TempDir, Grants) {
    let root = tempfile::tempdir().expect("tempdir");
    let docs = root.path().join("docs");
    std::fs::create_dir(&docs).expect("mkdir");
    std::fs::write(docs.join("a.txt"), "inside").expect("write");
    std::fs::write(root.path().join("outside.txt"), "outside").expect("write");
    std::os::unix::fs::symlink(root.path().join("outside.txt"), docs.join("link.txt")).expect("symlink");
    let path = std::fs::canonicalize(&docs).expect("canonical");
    (root, Grants { dirs: vec![DirGrant { name: "docs".into(), path }], ..Grants::default() })
}

#[test]
fn a_granted_directory_is_read_only_and_cannot_be_escaped() {
    let (_root, grants) = docs();
    let read = "def read_doc():\n    with open('/dirs/docs/a.txt') as f:\n        return {'text': f.read()}\n";
    assert_eq!(python(read, "read_doc", grants.clone()).expect("granted")["text"], "inside");
    assert!(python(read, "read_doc", Grants::default()).is_err(), "not granted, not there");

    let attempts = "def escape():\n    out = {}\n    for p in ['/dirs/docs/../outside.txt', '/dirs/docs/link.txt', '/etc/passwd', '/dirs/../etc/passwd']:\n        try:\n            out[p] = open(p).read()\n        except Exception as e:\n            out[p] = 'refused: ' + type(e).__name__\n    try:\n        open('/dirs/docs/new.txt', 'w').write('x')\n        out['write'] = 'wrote'\n    except Exception as e:\n        out['write'] = 'refused: ' + type(e).__name__\n    return out\n";
    let out = python(attempts, "escape", grants.clone()).expect("runs");
    for (path, outcome) in out.as_object().expect("object") {
        assert!(outcome.as_str().is_some_and(|s| s.starts_with("refused")), "{path}: {outcome}");
    }
    assert!(!Path::new(&grants.dirs[0].path).join("new.txt").exists());
}

#[test]
fn hostile_python_finds_no_way_out_with_or_without_grants() {
    // Each way out must raise; `_socket` is compiled into the interpreter, so it is used, not just
    // imported: a connection to the loopback server that the granted tool can reach.
    let port = http_port();
    let ways = [
        ("socket", "import socket".to_owned()),
        (
            "_socket.connect",
            format!(
                "import _socket\ns = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)\ns.connect(('127.0.0.1', {port}))"
            ),
        ),
        ("_socket.getaddrinfo", "import _socket\n_socket.getaddrinfo('localhost', 80)".to_owned()),
        ("http.client", "import http.client".to_owned()),
        ("urllib.request", "import urllib.request".to_owned()),
        ("ctypes", "import ctypes".to_owned()),
        ("subprocess", "import subprocess".to_owned()),
        ("os.system", "import os\nos.system('true')".to_owned()),
        ("open /etc/passwd", "open('/etc/passwd').read()".to_owned()),
    ];
    let mut code = String::from("def out():\n    tried = {}\n");
    for (name, attempt) in &ways {
        code.push_str("    try:\n");
        for line in attempt.lines() {
            code.push_str(&format!("        {line}\n"));
        }
        code.push_str(&format!("        tried[{name:?}] = 'got out'\n    except BaseException as e:\n        tried[{name:?}] = 'refused: ' + type(e).__name__\n"));
    }
    code.push_str("    return tried\n");
    for grants in [Grants::default(), loopback(true)] {
        let out = python(&code, "out", grants).expect("runs");
        assert_eq!(out.as_object().map(|o| o.len()), Some(ways.len()), "{out}");
        for (way, outcome) in out.as_object().expect("object") {
            assert!(outcome.as_str().is_some_and(|s| s.starts_with("refused")), "{way}: {outcome}");
        }
    }
}

#[test]
fn environment_variables_pass_only_when_granted() {
    // SAFETY: set once before any call reads it; the test binary reads no other variable so named.
    unsafe { std::env::set_var("TOOLSMITH_TEST_GRANTED_VAR", "visible") };
    let code = "import os\n\ndef env():\n    return {'granted': os.environ.get('TOOLSMITH_TEST_GRANTED_VAR'), 'home': os.environ.get('HOME'), 'n': len(os.environ)}\n";
    let none = python(code, "env", Grants::default()).expect("runs");
    assert_eq!(none, json!({"granted": null, "home": null, "n": 0}));
    let grants = Grants { env: vec!["TOOLSMITH_TEST_GRANTED_VAR".into()], ..Grants::default() };
    let some = python(code, "env", grants).expect("runs");
    assert_eq!(some, json!({"granted": "visible", "home": null, "n": 1}));
}

#[test]
fn python_tools_reach_granted_hosts_and_secrets_through_import_toolsmith() {
    let port = http_port();
    let code = format!(
        "import toolsmith\n\ndef fetch():\n    key = toolsmith.secret('api_token')\n    r = toolsmith.http_get('http://127.0.0.1:{port}/echo-auth', {{'authorization': 'Bearer ' + key}})\n    return {{'status': r.status, 'text': r.text, 'key': key}}\n"
    );
    let value = "py-secret-55aa21c0ffee";
    // SAFETY: set before any call reads it; no other test reads this variable.
    unsafe { std::env::set_var("TOOLSMITH_TEST_PY_SECRET", value) };
    let mut grants = loopback(true);
    grants
        .secrets
        .push(SecretGrant { name: "api_token".into(), source: SecretSource::Env("TOOLSMITH_TEST_PY_SECRET".into()) });
    let out = python(&code, "fetch", grants).expect("granted");
    assert_eq!(out["status"], 200);
    assert_eq!(out["text"], "authorization: Bearer [redacted]");
    assert_eq!(out["key"], "[redacted]", "returned as is, scrubbed by the host");

    let e = python(&code, "fetch", loopback(true)).expect_err("the secret is not granted");
    assert_eq!(e.kind, ErrorKind::PermissionDenied, "{e:?}");
    assert_eq!(e.expected.as_deref(), Some("secret:api_token"));
    let bare = format!(
        "import toolsmith\n\ndef get():\n    return {{'s': toolsmith.http_get('http://127.0.0.1:{port}/hello').status}}\n"
    );
    let e = python(&bare, "get", Grants::default()).expect_err("nothing granted");
    assert_eq!(e.kind, ErrorKind::PermissionDenied, "{e:?}");
    assert_eq!(python(&bare, "get", loopback(true)).expect("granted")["s"], 200);
}
