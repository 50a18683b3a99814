//! An environment of the bundled world for tests and benchmarks: the tiny policy's tokenizer,
//! a search tool over each world's corpus, and the oracle as the scripted client.

#![allow(dead_code)]

use std::sync::Arc;

use serde_json::Value;
use toolsmith_agent::backend::{Backend, GenerateOptions, Message};
use toolsmith_agent::env::{Corpus, Task};
use toolsmith_agent::tools::{Executor, LocalTools};
use toolsmith_agent::{Mode, Oracle};
use toolsmith_daemon::http::HttpOptions;
use toolsmith_env::openenv::EnvServer;
use toolsmith_env::{ClientsOnly, EnvOptions, Environment};
use toolsmith_policy::Tokenizer;
use toolsmith_train::config::WorldsData;
use toolsmith_train::rl::{Method, RlConfig, sampler};
use toolsmith_train::{DeviceChoice, RunSettings};

/// A small run of `method`: two worlds of two countries, one task per family.
pub fn config(method: Method) -> RlConfig {
    let base = RlConfig::for_method(method);
    RlConfig {
        worlds: WorldsData {
            seeds: vec![5, 6],
            countries: 2,
            tasks_per_family: 1,
            styles: vec![method.mode()],
            ..WorldsData::default()
        },
        eval: None,
        tasks_per_iteration: 2,
        group_size: 2,
        max_turns: 6,
        max_tokens: 512,
        run: RunSettings { threads: 1, device: DeviceChoice::Cpu, ..base.run.clone() },
        ..base
    }
}

/// The tools of a world: its corpus's search (and nothing that needs the sandbox).
pub fn tools(corpus: Arc<Corpus>) -> Arc<dyn Executor> {
    Arc::new(LocalTools::new().with_corpus(corpus))
}

/// The run of `config` set up as an environment would be, turns from clients.
pub fn prepared(config: RlConfig, dir: &std::path::Path) -> sampler::Environment {
    sampler::Environment::prepare(config, dir, &tools, |_| Ok(Arc::new(ClientsOnly))).expect("prepare")
}

/// An environment of `config` with `options`.
pub fn environment(config: RlConfig, dir: &std::path::Path, options: EnvOptions) -> Arc<Environment> {
    let prepared = prepared(config, dir);
    let tokenizer = prepared.builder.tokenizer().clone();
    Arc::new(Environment::new(prepared.sampler, Some(tokenizer), options))
}

/// Serves `env` on a free loopback port; returns its base URL.
pub async fn serve(env: Arc<Environment>) -> String {
    let server = EnvServer::bind(env, HttpOptions::new("127.0.0.1:0".parse().expect("addr"))).await.expect("bind");
    let addr = server.local_addr().expect("addr");
    tokio::spawn(server.serve(std::future::pending()));
    format!("http://{addr}")
}

/// Every task of the environment's worlds.
pub fn all_tasks(env: &Environment) -> Vec<Task> {
    env.sampler().worlds().iter().flat_map(|w| w.tasks.iter().cloned()).collect()
}

/// The scripted client: the oracle's next turn for an observation's messages.
pub struct Scripted {
    oracle: Oracle,
}

impl Scripted {
    pub fn new(env: &Environment, mode: Mode) -> Scripted {
        let tokenizer = Arc::new(Tokenizer::tiny().expect("tokenizer"));
        Scripted { oracle: Oracle::new(&all_tasks(env), mode, tokenizer) }
    }

    pub async fn turn(&self, observation: &Value) -> String {
        let messages: Vec<Message> =
            serde_json::from_value(observation["messages"].clone()).expect("the observation's messages");
        self.oracle.complete(&messages, &GenerateOptions::default()).await.expect("oracle").text
    }
}

/// A sixth method, added in one place outside the table (as a user would in a crate of their
/// own): the reward is the share of even token ids the episode sampled, which differs between an
/// untrained policy's episodes (under the papers' rewards all of them score 0), credited as GRPO.
pub mod even {
    use toolsmith_agent::{Mode, Trajectory};
    use toolsmith_train::TrainError;
    use toolsmith_train::rl::RlConfig;
    use toolsmith_train::rl::method::{
        CreditAssignment, CreditContext, GroupView, Method, MethodSpec, TurnCredit, episode_credit,
    };
    use toolsmith_train::rl::reward::EpisodeReward;

    struct EvenTokens;

    /// The share of even ids among the tokens the episode sampled.
    pub fn share(episode: &Trajectory) -> f64 {
        let ids: Vec<i64> =
            episode.steps.iter().filter_map(|s| s.tokens.as_ref()).flat_map(|t| t.output_ids.iter().copied()).collect();
        ids.iter().filter(|&&id| id % 2 == 0).count() as f64 / ids.len().max(1) as f64
    }

    impl CreditAssignment for EvenTokens {
        fn reward(&self, episode: &Trajectory, _: &[String], _: &RlConfig) -> EpisodeReward {
            let even = share(episode);
            EpisodeReward { total: even, outcome: even, steps: Vec::new() }
        }

        fn credit(&self, g: &GroupView<'_>, c: &CreditContext<'_>) -> Result<Vec<Vec<TurnCredit>>, TrainError> {
            Ok(episode_credit(g, c.config.group_norm))
        }
    }

    fn unchanged(config: RlConfig) -> RlConfig {
        config
    }

    static SPEC: MethodSpec = MethodSpec {
        name: "even-tokens",
        aliases: &[],
        summary: "A test's: the share of even token ids sampled.",
        mode: Mode::Gap,
        defaults: unchanged,
        assign: &EvenTokens,
    };

    /// The method.
    pub fn method() -> Method {
        Method::from_spec(&SPEC)
    }
}
