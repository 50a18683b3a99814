//! What a capability grant costs.
//!
//! 1. A granted HTTP GET to a loopback server through the sandbox (the bundled `http_get`, a
//!    fresh instance, both schema checks, the host's allow-list and address checks) against the
//!    same request made natively with the same HTTP client, in the same run.
//! 2. A pure tool's call (`calculator`, no grants) against the same call with grants attached
//!    (one unrelated HTTP grant: the per-call capability state is built but never used), and the
//!    native calculator as the baseline `cargo bench --bench call` uses, so the ratio to native can
//!    be compared with that bench's.
//!
//! `cargo bench -p toolsmith-sandbox --bench reach`. `TOOLSMITH_BENCH_CALLS` (default 2000).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::time::Duration;

use common::{measure, us};
use serde_json::json;
use toolsmith_contract::capabilities::{Grants, HostPattern, HttpGrant};
use toolsmith_sandbox::validate::ToolSchemas;
use toolsmith_sandbox::{Limits, Sandbox, SandboxConfig, Toolbox};

/// A loopback server: one thread, one request per connection (`connection: close`), as both
/// sides of the comparison then pay for a fresh TCP connection each time.
fn server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(&mut stream);
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
                line.clear();
            }
            let body = r#"{"temp": 21, "city": "Oslo"}"#;
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

fn row(label: &str, (p50, p99): (Duration, Duration), base: Option<(Duration, Duration)>) {
    let ratio = base.map(|(b, _)| format!("{:.2}x", p50.as_secs_f64() / b.as_secs_f64())).unwrap_or_default();
    println!("{label:<58} {:>9.1} {:>9.1} {ratio:>8}", us(p50), us(p99));
}

fn main() {
    let n: usize = std::env::var("TOOLSMITH_BENCH_CALLS").ok().and_then(|s| s.parse().ok()).unwrap_or(2000);
    let cache = tempfile::tempdir().expect("tempdir");
    let config = SandboxConfig { cache_dir: Some(cache.path().to_owned()), ..SandboxConfig::default() };
    let toolbox = Toolbox::new(Sandbox::new(config).expect("sandbox"));
    let http_get =
        toolbox.load_component(toolsmith_bundled::get("http_get").expect("bundled").component).expect("http_get loads");
    let port = server();
    let host = format!("http://127.0.0.1:{port}");
    let grant = |pattern: &str| HttpGrant {
        pattern: HostPattern::parse(pattern).expect("pattern"),
        methods: vec!["GET".into()],
        allow_private: true,
    };
    let granted = http_get.with_grants(Grants { http: vec![grant(&host)], ..Grants::default() });
    let url = format!("{host}/now");
    let args = json!({ "url": url });

    println!("capability grants, {n} calls each (p50, p99 in microseconds; ratio of p50s)");
    println!("{:<58} {:>9} {:>9} {:>8}", "", "p50", "p99", "ratio");
    let agent = ureq::Agent::new_with_defaults();
    let native = measure(n, || {
        let mut response = agent.get(&url).call().expect("native GET");
        let body = response.body_mut().read_to_string().expect("body");
        let _: serde_json::Value = serde_json::from_str(&body).expect("json");
    });
    row("native GET with ureq (baseline)", native, None);
    let sandboxed = measure(n, || {
        let out = toolbox.call_tool(&granted, &args, Limits::default()).expect("granted call");
        assert_eq!(out.value["status"], 200);
    });
    row("http_get granted, through the sandbox", sandboxed, Some(native));

    let calculator = toolbox
        .add_component(toolsmith_bundled::get("calculator").expect("bundled").component)
        .expect("calculator loads");
    let calc_args = json!({"expression": "2 * (3 + 4) ^ 2 / sqrt(16)"});
    let schemas =
        ToolSchemas::compile(&calculator.manifest.input_schema, &calculator.manifest.output_schema).expect("schemas");
    let native_calc = measure(n * 10, || {
        schemas.check_args("calculator", &calc_args).expect("args");
        let out = calculator::call_json(&calc_args.to_string()).expect("call");
        let value: serde_json::Value = serde_json::from_str(&out).expect("json");
        schemas.check_output("calculator", &value).expect("output");
    });
    row("calculator natively, same schema checks (baseline)", native_calc, None);
    let pure = measure(n * 10, || {
        toolbox.call_tool(&calculator, &calc_args, Limits::default()).expect("call");
    });
    row("calculator, no grants", pure, Some(native_calc));
    let with_grants = calculator.with_grants(Grants { http: vec![grant("api.example.com")], ..Grants::default() });
    let granted_calc = measure(n * 10, || {
        toolbox.call_tool(&with_grants, &calc_args, Limits::default()).expect("call");
    });
    row("calculator with an (unused) HTTP grant", granted_calc, Some(native_calc));
    println!(
        "grants attached but unused cost {:+.1} us per call at p50 ({:+.1}%)",
        us(granted_calc.0) - us(pure.0),
        100.0 * (granted_calc.0.as_secs_f64() / pure.0.as_secs_f64() - 1.0)
    );
}
