//! Capability grants: stored per tool as references, logged, bound to the tool's code.

use toolsmith_contract::capabilities::{Grants, HostPattern, HttpGrant, SecretGrant, SecretSource};
use toolsmith_registry::RegistryError;

use super::{open, temp, tool};

fn grants() -> Grants {
    Grants {
        http: vec![HttpGrant {
            pattern: HostPattern::parse("api.example.com").expect("pattern"),
            methods: vec!["GET".into()],
            allow_private: false,
        }],
        secrets: vec![SecretGrant { name: "api_key".into(), source: SecretSource::Env("WEATHER_KEY".into()) }],
        env: vec!["LANG".into()],
        ..Grants::default()
    }
}

#[test]
fn grants_are_stored_logged_and_revoked_by_key() {
    let (_dir, path) = temp();
    let mut r = open(&path);
    r.register(tool("weather", "Current weather for a city.").with_blob(b"code v1".to_vec()), true).expect("register");
    assert!(r.grants("weather").expect("grants").entries.is_empty(), "pure until granted");

    let keys = r.grant("weather", &grants(), "ops").expect("grant");
    assert_eq!(keys, ["http:https://api.example.com:443", "secret:api_key", "env:LANG"]);
    let held = r.grants("weather").expect("grants");
    assert_eq!(held.active, grants());
    assert!(held.entries.iter().all(|e| e.current && e.granted_by == "ops"));
    let secret = held.entries.iter().find(|e| e.capability == "secret:api_key").expect("listed");
    assert_eq!(secret.description, "from env:WEATHER_KEY", "a reference, never a value");

    // Survives reopening; revoking one key leaves the others.
    drop(r);
    let mut r = open(&path);
    assert_eq!(r.revoke("weather", &["env:LANG".into()], "alice").expect("revoke"), ["env:LANG"]);
    assert!(r.grants("weather").expect("grants").active.env.is_empty());
    let e = r.revoke("weather", &["dir:nope".into()], "alice").expect_err("not held");
    assert!(matches!(e, RegistryError::Invalid(_)), "{e}");
    assert_eq!(r.grants("weather").expect("grants").entries.len(), 2, "a bad revoke changes nothing");

    let log = r.grant_log(Some("weather"), 10).expect("log");
    let actions: Vec<_> = log.iter().map(|e| (e.action.as_str(), e.capability.as_str(), e.actor.as_str())).collect();
    assert_eq!(actions[0], ("revoke", "env:LANG", "alice"));
    assert_eq!(log.len(), 4);
    assert!(matches!(r.grant("nobody", &grants(), "ops"), Err(RegistryError::NotFound(_))));
}

#[test]
fn new_code_under_the_same_name_does_not_inherit_grants() {
    let (_dir, path) = temp();
    let mut r = open(&path);
    r.register(tool("weather", "Current weather for a city.").with_blob(b"code v1".to_vec()), true).expect("register");
    r.grant("weather", &grants(), "ops").expect("grant");
    // The same interface with other code: what an agent re-admitting a tool would register.
    r.register(tool("weather", "Current weather for a city.").with_blob(b"code v2".to_vec()), true).expect("replace");
    let held = r.grants("weather").expect("grants");
    assert!(held.active.is_empty(), "stale grants grant nothing: {:?}", held.active);
    assert!(held.entries.iter().all(|e| !e.current));
    r.grant("weather", &grants(), "ops").expect("grant again");
    assert_eq!(r.grants("weather").expect("grants").active, grants());
}

#[test]
fn removing_a_tool_removes_its_grants_but_keeps_the_log() {
    let (_dir, path) = temp();
    let mut r = open(&path);
    r.register(tool("weather", "Current weather for a city.").with_blob(b"code".to_vec()), true).expect("register");
    r.grant("weather", &grants(), "ops").expect("grant");
    r.remove("weather").expect("remove");
    r.register(tool("weather", "Current weather for a city.").with_blob(b"code".to_vec()), true).expect("again");
    assert!(r.grants("weather").expect("grants").entries.is_empty());
    assert_eq!(r.grant_log(Some("weather"), 10).expect("log").len(), 3);
}
