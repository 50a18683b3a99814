//! `toolsmith`: the command-line interface. It parses flags, calls the libraries and maps their
//! outcomes to output and exit codes; the work lives in `toolsmith-sandbox` and friends.

mod commands;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Agents make, run, remember and learn to use their own tools.
#[derive(Debug, Parser)]
#[command(name = "toolsmith", version, about, long_about = None)]
struct Cli {
    /// Directory for precompiled components [default: $TOOLSMITH_CACHE_DIR or ~/.cache/toolsmith/components].
    #[arg(long, global = true, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// Compile components in memory every time instead of caching them on disk.
    #[arg(long, global = true)]
    no_cache: bool,
    /// The tool registry [default: $TOOLSMITH_REGISTRY or ~/.local/share/toolsmith/registry.db].
    #[arg(long, global = true, value_name = "PATH")]
    registry: Option<PathBuf>,
    /// More logging (-v info, -vv debug, -vvv trace); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the bundled plugins on their examples and show what the platform does.
    Quickstart,
    /// Call a tool: a bundled or admitted tool's name, or a component file.
    Call(commands::call::CallArgs),
    /// Create a Python tool and run it once (SEARL's create_and_execute_mcp).
    Create(commands::create::CreateArgs),
    /// Run Python functions in the sandbox.
    #[command(subcommand)]
    Python(commands::python::PythonCommand),
    /// Write, build and inspect plugins.
    #[command(subcommand)]
    Plugin(commands::plugin::PluginCommand),
    /// Create, inspect and sample from policy checkpoints (the agent's language model).
    #[command(subcommand)]
    Policy(commands::policy::PolicyCommand),
    /// Serve the tool graph over MCP (stdio or streamable HTTP), with a status API.
    Serve(commands::serve::ServeArgs),
    /// Train the policy: supervised fine-tuning, reports.
    #[command(subcommand)]
    Train(commands::train::TrainCommand),
    /// Serve Toolsmith as the environment of other trainers: OpenEnv (TRL, SkyRL) and Atropos
    /// (verl).
    #[command(subcommand)]
    Env(commands::env::EnvCommand),
    /// Training jobs in a running daemon (`toolsmith serve --http`): submit, list, show, cancel,
    /// resume, watch.
    Jobs(commands::jobs::JobsArgs),
    /// Evaluate a policy on a task set: EM, F1, pass@1, turns, tokens (TT, PT), cost-of-pass.
    Eval(commands::agent::EvalArgs),
    /// Answer one question and show the trace.
    Run(commands::agent::RunArgs),
    /// The bundled offline world: entities, a corpus and task families.
    #[command(subcommand)]
    World(commands::agent::WorldCommand),
    /// Browse and maintain the tool graph (the registry).
    #[command(subcommand)]
    Tools(commands::tools::ToolsCommand),
    /// Say what this binary found of its native parts (libtorch, ONNX Runtime, models, guests,
    /// SDK), what is missing and the command that fixes it.
    Doctor(commands::doctor::DoctorArgs),
    /// Print the JSON Schemas of the contract (tool manifest, structured error).
    Schema {
        /// Which schema.
        #[arg(value_enum, default_value = "manifest")]
        which: commands::SchemaName,
    },
    /// Print a page of the docs book's reference (docs/reference/), drawn from the code.
    #[command(hide = true)]
    Reference {
        /// Which page.
        #[arg(value_enum)]
        page: commands::reference::Page,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    let env = commands::Env { cache_dir: cli.cache_dir, no_cache: cli.no_cache, registry: cli.registry };
    let result = match cli.command {
        Command::Quickstart => commands::quickstart::run(&env),
        Command::Call(args) => commands::call::run(&env, args),
        Command::Env(cmd) => commands::env::run(&env, cmd),
        Command::Create(args) => commands::create::run(&env, args),
        Command::Python(cmd) => commands::python::run(&env, cmd),
        Command::Plugin(cmd) => commands::plugin::run(&env, cmd),
        Command::Policy(cmd) => commands::policy::run(cmd),
        Command::Serve(args) => commands::serve::run(&env, args),
        Command::Train(cmd) => commands::train::run(&env, cmd),
        Command::Jobs(args) => commands::jobs::run(args),
        Command::Eval(args) => commands::agent::eval(&env, args),
        Command::Run(args) => commands::agent::run(&env, args),
        Command::World(cmd) => commands::agent::world(&env, cmd),
        Command::Tools(cmd) => commands::tools::run(&env, cmd),
        Command::Doctor(args) => commands::doctor::run(&env, args),
        Command::Schema { which } => commands::print_schema(which),
        Command::Reference { page } => commands::reference::run(page, <Cli as clap::CommandFactory>::command()),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn init_logging(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    let default = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
}
