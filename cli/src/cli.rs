//! The `benchfleet` operator command line.
//!
//! Exit codes (also in `--help` and the README): 0 everything asked for
//! succeeded (every job of a run); 1 a run ended with failed or cancelled
//! jobs; 2 bad input (a matrix or an export file with an error, bad flags:
//! INVALID_ARGUMENT); 3 the controller could not be reached (UNAVAILABLE);
//! 4 no such run or agent (NOT_FOUND); 5 refused in the run's state, e.g. a
//! retry of a run still running (FAILED_PRECONDITION); 6 not allowed
//! (UNAUTHENTICATED, PERMISSION_DENIED); 7 the controller failed (INTERNAL,
//! any other code); 130 interrupted. A failure met in the local store is
//! given the code the controller would give it.

mod fleet;
pub use fleet::FleetCommand;
use std::io::{IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use benchfleet_controller::report::document;
use benchfleet_controller::store::{SledStore, Store, data_dir};
use benchfleet_proto as pb;
use benchfleet_study::matrix::Strategy;
use benchfleet_study::model::RunId;
use benchfleet_study::report::{self, Format, compare, doc::ReportDoc};
use clap::{Parser, Subcommand};
use serde_json::json;

use crate::client::{self, StatusError, Target, Unreachable};
use crate::local::{LocalFleet, simulated_agent};
use benchfleet_core::tls::ClientTls;

pub const EXIT_FAILED_JOBS: i32 = 1;
pub const EXIT_BAD_INPUT: i32 = 2;
pub const EXIT_UNREACHABLE: i32 = 3;
pub const EXIT_NOT_FOUND: i32 = 4;
pub const EXIT_REFUSED: i32 = 5;
pub const EXIT_NOT_ALLOWED: i32 = 6;
pub const EXIT_CONTROLLER_FAILED: i32 = 7;
pub const EXIT_INTERRUPTED: i32 = 130;

/// The exit code of a call that failed with `code`.
pub fn exit_code_of(code: tonic::Code) -> i32 {
    use tonic::Code;
    match code {
        Code::InvalidArgument | Code::OutOfRange => EXIT_BAD_INPUT,
        Code::Unavailable | Code::DeadlineExceeded => EXIT_UNREACHABLE,
        Code::NotFound => EXIT_NOT_FOUND,
        Code::FailedPrecondition | Code::AlreadyExists => EXIT_REFUSED,
        Code::Unauthenticated | Code::PermissionDenied => EXIT_NOT_ALLOWED,
        _ => EXIT_CONTROLLER_FAILED,
    }
}

/// The exit code of an error: the gRPC code of the call that failed, or of
/// the same kind of failure met in the local store; anything else is bad
/// input.
pub fn exit_code(e: &anyhow::Error) -> i32 {
    use benchfleet_controller::export::ExportError;
    use benchfleet_controller::store::StoreError;
    for cause in e.chain() {
        if cause.is::<Unreachable>() {
            return EXIT_UNREACHABLE;
        }
        if let Some(s) = cause.downcast_ref::<StatusError>() {
            return exit_code_of(s.code);
        }
        match cause.downcast_ref::<ExportError>() {
            Some(ExportError::NotFound(_) | ExportError::Store(StoreError::NotFound(_))) => return EXIT_NOT_FOUND,
            Some(ExportError::NotOver(_)) => return EXIT_REFUSED,
            _ => {}
        }
        match cause.downcast_ref::<StoreError>() {
            Some(StoreError::NotFound(_)) => return EXIT_NOT_FOUND,
            Some(StoreError::NotOver(_)) => return EXIT_REFUSED,
            _ => {}
        }
    }
    EXIT_BAD_INPUT
}

#[derive(Parser, Debug)]
#[command(
    name = "benchfleet",
    version,
    about = "Benchmark LLM inference engines across a fleet of GPU hosts",
    after_help = "Environment: BENCHFLEET_CONTROLLER, BENCHFLEET_DATA_DIR and BENCHFLEET_IDENTITY (as their flags), \
                  RUST_LOG (the log filter), USER (who cancelled or drained, in the notes, without TLS; under \
                  TLS the certificate's name).\n\nExit status: 0 on success; 1 when a \
                  run's jobs failed or its report recommends nothing (run, watch, report), or compare found a \
                  regression; 2 for bad input (a matrix, an export file, a flag; INVALID_ARGUMENT); 3 when the \
                  controller cannot be reached (UNAVAILABLE); 4 when there is no such run or agent (NOT_FOUND); 5 \
                  when the run's state refuses the command, e.g. retry of a run still running, cancel of one over, \
                  export of one not over (FAILED_PRECONDITION); 6 when the operator's certificate may not do it \
                  (UNAUTHENTICATED, PERMISSION_DENIED); 7 when the controller failed (INTERNAL: its store failed; \
                  any other gRPC code); 130 when interrupted. Against the local store, each failure exits as the \
                  controller's answer would."
)]
pub struct Cli {
    /// Where the local store lives (runs, jobs, request records).
    #[arg(long, global = true, env = "BENCHFLEET_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// A running controller's gRPC URL; without it, the listings, report, export and import use the local store.
    #[arg(long, global = true, env = "BENCHFLEET_CONTROLLER")]
    pub controller: Option<String>,
    /// The operator's identity for an https:// controller: a directory with ca.pem, operator.pem and
    /// operator-key.pem (`benchfleet certs issue`). Default: the data directory's pki/ (admin.pem), else
    /// $XDG_CONFIG_HOME/benchfleet/identity/.
    #[arg(long, global = true, env = "BENCHFLEET_IDENTITY", value_name = "DIR")]
    pub identity: Option<PathBuf>,
    /// Allow an http:// controller URL to a host other than this one (sent in plain text, unauthenticated).
    #[arg(long, global = true)]
    pub insecure: bool,
    /// Print listings as JSON.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a matrix and print its report: on this machine with simulated engines (--local), or on the fleet of
    /// the controller given with --controller (submit, then watch).
    Run {
        matrix: PathBuf,
        /// Start a controller, an agent and simulated engines here.
        #[arg(long)]
        local: bool,
    },
    /// Check a matrix file without running it.
    Validate { matrix: PathBuf },
    /// Fleet acceptance: the same benchmark on every host, each judged against its peers.
    Fleet {
        #[command(subcommand)]
        action: FleetCommand,
    },
    /// Submit a matrix; prints the run id at once.
    Submit {
        matrix: PathBuf,
        /// Print the jobs and where the controller would place each group
        /// on its fleet now; submit nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Follow a run until it ends (re-attaching if the controller restarts).
    Watch {
        run_id: String,
        /// How long to wait for a controller that went away.
        #[arg(long, default_value_t = 300)]
        reconnect_for_s: u64,
    },
    /// List runs; `runs delete RUN` deletes one.
    Runs {
        #[command(subcommand)]
        action: Option<RunsCommand>,
    },
    /// A run's jobs: state, agent, error, and every attempt with the records it stored.
    Jobs { run_id: String },
    /// Print a run's report.
    Report {
        run_id: String,
        /// console, markdown (the reference document), json (docs/report-json.md), csv (a row per configuration,
        /// profile and repeat) or html (one page with charts); --json means json.
        #[arg(long, default_value = "console")]
        format: String,
        /// Write the report to this file instead of standard output.
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
    /// Compare run B with run A: each headline number's change with its 95% interval; exit 1 on a significant
    /// regression of a gated metric, 0 otherwise. A or B may be a JSON report file (`report --format json`).
    Compare {
        run_a: String,
        run_b: String,
        /// The change a gated metric may worsen by before it is a regression: 5% or 0.05.
        #[arg(long, default_value = "5%")]
        threshold: String,
        /// A metric that gates (repeatable): e.g. total_token_throughput, mean_ttft_ms, p99_itl_ms. Default: A's
        /// objective, mean_ttft_ms and mean_tpot_ms.
        #[arg(long = "metric")]
        metrics: Vec<String>,
    },
    /// Write a run, whole (matrix, jobs, summaries, every request record), as JSON lines (docs/export.md).
    Export {
        run_id: String,
        /// The file to write (stdout by default, or with "-"); it appears only once complete.
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Read a run's export into the store (or the controller's); prints the run's id there.
    Import {
        /// The export; "-" reads stdin.
        file: String,
    },
    /// List the agents, their leases and their GPUs.
    Agents,
    /// Cancel a run: queued jobs never start, running ones are stopped.
    Cancel {
        run_id: String,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Run a finished run's failed and cancelled jobs again.
    Retry { run_id: String },
    /// Drain an agent (by name or id): its current work finishes, it gets no new work.
    Drain {
        agent: String,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Undo a drain.
    Undrain { agent: String },
    /// The fleet's certificates: a new CA (init) and operators' identities (issue), in the data directory's pki/.
    #[command(subcommand)]
    Certs(Certs),
    /// Join tokens for agents (`benchfleet-agent join`): on the local store, or the controller's (admin).
    #[command(subcommand)]
    Token(TokenCommand),
    /// Cut an agent or operator off: every certificate of NAME issued until now opens nothing, live sessions
    /// included; an agent of that name may join again with a new token.
    Revoke {
        name: String,
        #[arg(long, default_value = "")]
        reason: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum RunsCommand {
    /// Delete a run that is over (finished or cancelled, no job left running), with its jobs, records,
    /// summaries and telemetry, and the stored files no other run names: through the controller (admin), or on
    /// the local store.
    Delete { run_id: String },
}

#[derive(Subcommand, Debug)]
pub enum TokenCommand {
    /// Create a join token: printed alone on stdout; its expiry and the agent's join command on stderr.
    Create {
        /// How long it may be used: 90s, 30m, 1h, 2d.
        #[arg(long, default_value = "1h", value_parser = parse_ttl)]
        ttl: u64,
        /// Only an agent of this name may join with it.
        #[arg(long)]
        agent: Option<String>,
        /// How many agents may join with it.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        uses: u32,
    },
}

/// `90s`, `30m`, `1h`, `2d` (or plain seconds) as seconds.
fn parse_ttl(s: &str) -> Result<u64, String> {
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = n.parse().map_err(|_| format!("'{s}' is not a duration like 90s, 30m, 1h or 2d"))?;
    let scale = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("'{s}': the unit is s, m, h or d")),
    };
    match n.checked_mul(scale) {
        Some(0) | None => Err(format!("'{s}' is not a usable lifetime")),
        Some(secs) => Ok(secs),
    }
}

#[derive(Subcommand, Debug)]
pub enum Certs {
    /// Create DATA_DIR/pki/: the CA, the controller's certificate, the first admin operator's, the ingest key.
    /// Prints the CA's hash, which agents pin when they join. Never overwrites.
    Init {
        /// Another name or address the controller is reached at (repeatable); localhost, 127.0.0.1, ::1 and
        /// this host's name are always in its certificate.
        #[arg(long = "san", value_name = "NAME")]
        sans: Vec<String>,
    },
    /// Issue an operator's identity: a directory with ca.pem, operator.pem and operator-key.pem, for
    /// `benchfleet --identity DIR`.
    Issue {
        /// The operator's name, as notes record who cancelled or drained.
        name: String,
        /// read: listings, reports, watch, export, plans; admin: also submit, cancel, retry, drain, import, delete.
        #[arg(long, value_parser = ["read", "admin"])]
        role: String,
        /// Where to write it (default: ./NAME).
        #[arg(long, short)]
        out: Option<PathBuf>,
    },
}

/// Who the operator is, until operators authenticate.
fn whoami() -> String {
    std::env::var("USER").or_else(|_| std::env::var("LOGNAME")).unwrap_or_default()
}

/// Runs the command and returns the exit code; errors print as `error: ...`
/// and exit with the code their kind has.
pub async fn main(cli: Cli) -> i32 {
    match dispatch(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            exit_code(&e)
        }
    }
}

fn need_controller(controller: Option<&Target>) -> anyhow::Result<&Target> {
    controller.context("give the controller's URL with --controller (or BENCHFLEET_CONTROLLER)")
}

/// The controller given with --controller, and what this operator holds to
/// reach it (see `Cli::identity`).
fn target(cli: &Cli) -> anyhow::Result<Option<Target>> {
    let Some(url) = &cli.controller else { return Ok(None) };
    let mut tls = operator_identity(cli)?;
    tls.insecure = cli.insecure;
    Ok(Some(Target { url: url.clone(), tls }))
}

fn operator_identity(cli: &Cli) -> anyhow::Result<ClientTls> {
    let from = |dir: &Path| -> anyhow::Result<ClientTls> {
        let mut tls = ClientTls::from_dir(dir, "operator")?;
        if tls.identity.is_none() {
            tls = ClientTls::from_dir(dir, "admin")?;
        }
        Ok(tls)
    };
    if let Some(dir) = &cli.identity {
        anyhow::ensure!(dir.is_dir(), "--identity {}: no such directory", dir.display());
        return from(dir);
    }
    let pki = data_dir(cli.data_dir.as_deref()).join("pki");
    if pki.join(benchfleet_controller::pki::ADMIN_CERT).is_file() {
        return from(&pki);
    }
    let config = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")));
    match config.map(|c| c.join("benchfleet/identity")) {
        Some(dir) if dir.is_dir() => from(&dir),
        _ => Ok(ClientTls::default()),
    }
}

/// `benchfleet certs ...`, on the data directory's pki/.
fn certs(cli: &Cli, command: &Certs) -> anyhow::Result<i32> {
    use benchfleet_controller::pki::{self, Role};
    let dir = data_dir(cli.data_dir.as_deref()).join("pki");
    match command {
        Certs::Init { sans } => {
            let made = pki::init(&dir, &hostname(), sans)?;
            println!(
                "created {}/ ({}, {}, {}, {}, {}, {}, {})",
                made.dir.display(),
                pki::CA_CERT,
                pki::CA_KEY,
                pki::CONTROLLER_CERT,
                pki::CONTROLLER_KEY,
                pki::ADMIN_CERT,
                pki::ADMIN_KEY,
                pki::INGEST_KEY
            );
            println!("CA hash: {}", made.ca_hash);
        }
        Certs::Issue { name, role, out } => {
            let role = Role::parse(role).context("--role is read or admin")?;
            let out = out.clone().unwrap_or_else(|| PathBuf::from(name));
            let issued = pki::issue_operator(&dir, name, role, &out)?;
            println!(
                "created {}/ ({}, {}, {}): {role} operator '{name}', serial {}",
                out.display(),
                pki::CA_CERT,
                pki::OPERATOR_CERT,
                pki::OPERATOR_KEY,
                issued.serial
            );
        }
    }
    Ok(0)
}

/// `benchfleet token create`: through the controller, or on the local store
/// (the controller that uses it must not be running).
async fn token(cli: &Cli, controller: Option<&Target>, command: &TokenCommand) -> anyhow::Result<i32> {
    let TokenCommand::Create { ttl, agent, uses } = command;
    let (token, expires_unix_ms, ca_hash, url) = match controller {
        Some(target) => {
            let r = client::connect(target)
                .await?
                .create_token(pb::CreateTokenRequest {
                    ttl_s: *ttl,
                    agent: agent.clone().unwrap_or_default(),
                    uses: *uses,
                })
                .await
                .map_err(client::status)?
                .into_inner();
            (r.token, r.expires_unix_ms, r.ca_hash, r.url)
        }
        None => {
            let dir = data_dir(cli.data_dir.as_deref());
            let ca_hash = benchfleet_controller::pki::ca_hash(&dir.join("pki"))?;
            let store = open_store(&dir)?;
            let now = benchfleet_controller::enrol::now_s();
            let (token, expires) = enrol_local(&store, |e| e.create_token(now, *ttl, agent.clone(), *uses))??;
            let url = format!("https://{}:7070", hostname());
            (token, benchfleet_controller::enrol::wire_ms(expires), ca_hash, url)
        }
    };
    println!("{token}");
    let expires = benchfleet_study::report::words::utc(i64::try_from(expires_unix_ms).unwrap_or(i64::MAX));
    let who = agent.as_ref().map_or_else(|| "any agent".to_owned(), |a| format!("agent '{a}' only"));
    eprintln!("expires {expires}; {uses} use{} by {who}", if *uses == 1 { "" } else { "s" });
    eprintln!("on the agent: benchfleet-agent join --controller {url} --token {token} --ca-hash {ca_hash}");
    Ok(0)
}

/// Changes the local store's enrolment state.
fn enrol_local<T>(
    store: &SledStore,
    change: impl FnOnce(&mut benchfleet_controller::enrol::Enrolment) -> T,
) -> anyhow::Result<T> {
    use benchfleet_controller::enrol::Enrolment;
    let mut state = match store.enrolment()? {
        Some(json) => Enrolment::from_json(&json).map_err(anyhow::Error::msg)?,
        None => Enrolment::default(),
    };
    let out = change(&mut state);
    store.put_enrolment(&state.to_json())?;
    Ok(out)
}

async fn revoke(cli: &Cli, controller: Option<&Target>, name: &str, reason: &str) -> anyhow::Result<i32> {
    let certificates = match controller {
        Some(target) => {
            client::connect(target)
                .await?
                .revoke(pb::RevokeRequest { name: name.to_owned(), reason: reason.to_owned() })
                .await
                .map_err(client::status)?
                .into_inner()
                .certificates
        }
        None => {
            anyhow::ensure!(benchfleet_controller::pki::valid_name(name), "'{name}' is not a certificate's name");
            let store = open_store(&data_dir(cli.data_dir.as_deref()))?;
            let now = benchfleet_controller::enrol::now_s();
            enrol_local(&store, |e| e.revoke(now, name, whoami(), reason.to_owned()))?.0
        }
    };
    println!("revoked every certificate of '{name}' issued until now ({certificates} live agent certificate(s))");
    Ok(0)
}

/// `benchfleet runs delete`: through the controller, or on the local store
/// (the controller that uses it must not be running).
async fn delete_run(cli: &Cli, controller: Option<&Target>, run_id: &str, json: bool) -> anyhow::Result<i32> {
    use benchfleet_controller::store::StoreError;
    let id: RunId = run_id.parse().map_err(anyhow::Error::msg)?;
    let deleted = match controller {
        Some(target) => client::connect(target)
            .await?
            .delete_run(pb::DeleteRunRequest { run_id: id.to_string() })
            .await
            .map_err(client::status)?
            .into_inner(),
        None => {
            let store = open_store(&data_dir(cli.data_dir.as_deref()))?;
            match store.delete_run(id) {
                Ok(d) => benchfleet_controller::convert::deleted(&d),
                // Refused as the controller refuses it.
                Err(StoreError::NotOver(why)) => {
                    return Err(StatusError::new(tonic::Code::FailedPrecondition, why).into());
                }
                Err(e) => return Err(e.into()),
            }
        }
    };
    if json {
        let answer = json!({
            "run_id": id.to_string(), "jobs": deleted.jobs, "records": deleted.records, "files": deleted.files,
        });
        println!("{answer}");
    } else {
        let files = match deleted.files.len() {
            0 => String::new(),
            1 => ", and 1 stored file no run names any more".to_owned(),
            n => format!(", and {n} stored files no run names any more"),
        };
        println!("run {id} deleted: {} jobs, {} records{files}", deleted.jobs, deleted.records);
    }
    Ok(0)
}

/// This host's name (what `certs init` puts in the controller's certificate).
fn hostname() -> String {
    benchfleet_core::hostname().unwrap_or_default()
}

async fn dispatch(cli: Cli) -> anyhow::Result<i32> {
    let json = cli.json;
    let controller = target(&cli)?;
    let controller = controller.as_ref();
    match &cli.command {
        Command::Certs(command) => certs(&cli, command),
        Command::Token(command) => token(&cli, controller, command).await,
        Command::Revoke { name, reason } => revoke(&cli, controller, name, reason).await,
        Command::Run { matrix, local: true } => run_local(matrix, &data_dir(cli.data_dir.as_deref()), json).await,
        Command::Run { matrix, local: false } => run_remote(controller, matrix, json).await,
        Command::Validate { matrix } => validate(matrix, json),
        Command::Fleet { action: FleetCommand::Check { matrix, per, hosts, drain_outliers } } => {
            fleet::check(controller, matrix, (per.as_deref(), hosts.as_ref()), *drain_outliers, json).await
        }
        Command::Fleet { action: FleetCommand::History { host, name } } => {
            fleet::history(&cli, controller, host.as_deref(), name.as_deref()).await
        }
        Command::Submit { matrix, dry_run: true } => dry_run(controller, matrix, json).await,
        Command::Submit { matrix, dry_run: false } => submit(controller, matrix, json).await,
        Command::Watch { run_id, reconnect_for_s } => {
            let url = need_controller(controller)?;
            follow(url, run_id, Duration::from_secs(*reconnect_for_s), json, false).await
        }
        Command::Runs { action: Some(RunsCommand::Delete { run_id }) } => {
            delete_run(&cli, controller, run_id, json).await
        }
        Command::Runs { action: None } => runs(&cli, controller).await,
        Command::Jobs { run_id } => jobs(&cli, controller, run_id).await,
        Command::Report { run_id, format, output } => {
            let format = if json { Format::Json } else { Format::parse(format).map_err(anyhow::Error::msg)? };
            let (text, recommended) = report_text(&cli, controller, run_id, format).await?;
            match output {
                Some(path) => {
                    std::fs::write(path, &text).with_context(|| format!("cannot write {}", path.display()))?
                }
                None => print!("{text}"),
            }
            Ok(if recommended { 0 } else { EXIT_FAILED_JOBS })
        }
        Command::Compare { run_a, run_b, threshold, metrics } => {
            let threshold = compare::parse_threshold(threshold).map_err(anyhow::Error::msg)?;
            compare::check_metrics(metrics).map_err(anyhow::Error::msg)?;
            let a = report_doc(&cli, controller, run_a).await?;
            let b = report_doc(&cli, controller, run_b).await?;
            let gate = if metrics.is_empty() { compare::default_gate(&a) } else { metrics.clone() };
            let c = compare::compare(&a, &b, threshold, &gate);
            print!("{}", compare::render(&c, &a, &b, threshold));
            Ok(if c.passed() { 0 } else { EXIT_FAILED_JOBS })
        }
        Command::Export { run_id, output } => {
            let output = output.as_deref().filter(|p| *p != Path::new("-"));
            export(controller, &data_dir(cli.data_dir.as_deref()), run_id, output).await
        }
        Command::Import { file } => {
            let imported = match controller {
                Some(url) => client::import(&mut client::connect(url).await?, file).await?,
                None => import_local(&data_dir(cli.data_dir.as_deref()), file)?,
            };
            print_imported(&imported, file, json);
            Ok(0)
        }
        Command::Agents => {
            let agents = remote(controller, async |c| c.list_agents(pb::ListAgentsRequest {}).await).await?.agents;
            if json {
                println!("{}", serde_json::Value::Array(agents.iter().map(agent_json).collect()));
            } else {
                print_agents(&agents);
            }
            Ok(0)
        }
        Command::Cancel { run_id, reason } => {
            let request = pb::CancelRunRequest { run_id: run_id.clone(), reason: reason.clone(), by: whoami() };
            let run = remote(controller, async |c| c.cancel_run(request).await).await?;
            let done = run.jobs_done - run.jobs_cancelled;
            show(json, run_json(&run), || {
                format!("run {} cancelled: {done} of {} jobs had ended", run.run_id, run.jobs_total)
            })
        }
        Command::Retry { run_id } => {
            let request = pb::RetryRunRequest { run_id: run_id.clone() };
            let r = remote(controller, async |c| c.retry_run(request).await).await?;
            show(json, json!({ "run_id": run_id, "jobs": r.jobs }), || {
                format!("run {run_id}: {} jobs queued again", r.jobs)
            })
        }
        Command::Drain { agent, reason } => {
            let request = pb::DrainAgentRequest { agent: agent.clone(), reason: reason.clone(), by: whoami() };
            let a = remote(controller, async |c| c.drain_agent(request).await).await?;
            show(json, agent_json(&a), || {
                format!("{} ({}) drained: {} groups running finish, no new work", a.name, a.agent_id, a.running.len())
            })
        }
        Command::Undrain { agent } => {
            let request = pb::UndrainAgentRequest { agent: agent.clone() };
            let a = remote(controller, async |c| c.undrain_agent(request).await).await?;
            show(json, agent_json(&a), || format!("{} ({}) takes work again", a.name, a.agent_id))
        }
    }
}

/// One call to the controller: connects, calls, and gives the answer (a
/// refusal as a `StatusError`, whose code makes the exit status).
async fn remote<T>(
    controller: Option<&Target>,
    call: impl AsyncFnOnce(&mut client::OperatorClient) -> Result<tonic::Response<T>, tonic::Status>,
) -> anyhow::Result<T> {
    let mut c = client::connect(need_controller(controller)?).await?;
    Ok(call(&mut c).await.map_err(client::status)?.into_inner())
}

/// Prints an answer: its JSON with --json, else its line of text; exit 0.
fn show(json: bool, value: serde_json::Value, text: impl FnOnce() -> String) -> anyhow::Result<i32> {
    if json {
        println!("{value}");
    } else {
        println!("{}", text());
    }
    Ok(0)
}

/// `run` through a controller: submits, then follows the run to its end.
async fn run_remote(controller: Option<&Target>, matrix: &Path, json: bool) -> anyhow::Result<i32> {
    let url = need_controller(controller)?;
    let sub = client::submission(matrix, None)?;
    note_datasets(&sub);
    let mut c = client::connect(url).await?;
    let submitted = client::submit(&mut c, sub).await?;
    announce(&submitted);
    follow(url, &submitted.run_id, Duration::from_secs(300), json, true).await
}

/// `validate`: the matrix's shape and warnings, with nothing submitted.
fn validate(matrix: &Path, json: bool) -> anyhow::Result<i32> {
    let sub = client::submission(matrix, None)?;
    let m = &sub.matrix;
    let warnings: Vec<&String> = m.warnings.iter().chain(&sub.dataset_notes).collect();
    let plural = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    let (strategy, shape, jobs) = match m.strategy {
        Strategy::Grid => {
            let jobs = m.grid_jobs();
            let searches: Vec<String> =
                m.searches().map(|(p, s)| format!("{} probes at most {} points", p.name, 2 + s.steps)).collect();
            let all = m.configs.len() * m.profiles.len() * m.repeats as usize;
            let plain = jobs == all && searches.is_empty();
            let join = if plain { " = " } else { ": " };
            let sep = if plain { " x " } else { ", " };
            let most = if searches.is_empty() { "" } else { "at most " };
            let mut why: Vec<String> = searches;
            if m.configs.iter().any(|c| m.profiles.iter().any(|p| !c.runs(&p.name))) {
                why.insert(0, "some configurations run only some profiles".to_owned());
            }
            let why = if why.is_empty() { String::new() } else { format!(" ({})", why.join("; ")) };
            let shape = format!(
                "{}{sep}{}{sep}{}{join}{most}{}{why}",
                plural(m.configs.len(), "configuration"),
                plural(m.profiles.len(), "profile"),
                plural(m.repeats as usize, "repeat"),
                plural(jobs, "job")
            );
            ("grid", shape, Some(jobs))
        }
        Strategy::Fleet => {
            let per = m.fleet.as_ref().map(|f| f.per).unwrap_or_default().as_str();
            let hosts = m.fleet.as_ref().and_then(|f| f.hosts.as_deref());
            let shape = format!(
                "{} on every {per} of the fleet{}: {} x {} per {per}",
                m.configs.first().map_or("one configuration", |c| c.name.as_str()),
                hosts.map(|h| format!(" on the host list '{h}'")).unwrap_or_default(),
                plural(m.profiles.len(), "profile"),
                plural(m.repeats as usize, "repeat")
            );
            ("fleet", shape, None)
        }
        Strategy::Greedy => {
            let shape = format!(
                "{}, {}, {}, {}; the jobs are planned stage by stage{}",
                plural(m.engines.len(), "engine"),
                plural(m.variants.len(), "variant"),
                plural(m.profiles.len(), "profile"),
                plural(m.repeats as usize, "repeat")
                    + &m.confirm_repeats
                        .map_or(String::new(), |n| format!(" ({n} to confirm a gain near the minimum effect)")),
                if m.cumulative { ", each variant on top of the configuration kept so far" } else { "" }
            );
            ("greedy", shape, None)
        }
    };
    if json {
        println!(
            "{}",
            json!({ "file": m.file, "valid": true, "strategy": strategy, "jobs": jobs, "warnings": warnings })
        );
    } else {
        for w in &warnings {
            eprintln!("warning: {w}");
        }
        println!("{}: valid: {strategy} strategy, {shape}", matrix.display());
    }
    Ok(0)
}

/// `submit --dry-run`: where the controller would place each group now.
async fn dry_run(controller: Option<&Target>, matrix: &Path, json: bool) -> anyhow::Result<i32> {
    let url = need_controller(controller)?;
    let sub = client::submission(matrix, None)?;
    note_datasets(&sub);
    let plan = client::plan(&mut client::connect(url).await?, sub).await?;
    if json {
        let groups: Vec<serde_json::Value> = plan
            .groups
            .iter()
            .map(|g| {
                json!({
                    "group": g.group, "config": g.config, "stage": g.stage,
                    "agent": (!g.agent.is_empty()).then_some(&g.agent), "gpus": g.gpus,
                    "jobs": g.jobs.iter().map(|j| json!({ "job": j.job, "profile": j.profile, "repeat": j.repeat })).collect::<Vec<_>>(),
                })
            })
            .collect();
        println!(
            "{}",
            json!({ "strategy": plan.strategy, "groups": groups, "waiting": plan.waiting, "warnings": plan.warnings })
        );
    } else {
        for w in &plan.warnings {
            eprintln!("warning: {w}");
        }
        print!("{}", client::plan_text(&plan));
    }
    Ok(0)
}

/// `submit`: the run's id on stdout, the controller's warnings on stderr.
async fn submit(controller: Option<&Target>, matrix: &Path, json: bool) -> anyhow::Result<i32> {
    let url = need_controller(controller)?;
    let sub = client::submission(matrix, None)?;
    note_datasets(&sub);
    let submitted = client::submit(&mut client::connect(url).await?, sub).await?;
    if json {
        println!("{}", json!({ "run_id": submitted.run_id, "jobs": submitted.jobs, "warnings": submitted.warnings }));
    } else {
        for w in &submitted.warnings {
            eprintln!("warning: {w}");
        }
        println!("{}", submitted.run_id);
    }
    Ok(0)
}

/// `runs`: through the controller, or from the local store.
async fn runs(cli: &Cli, controller: Option<&Target>) -> anyhow::Result<i32> {
    let runs = match controller {
        Some(_) => remote(controller, async |c| c.list_runs(pb::ListRunsRequest {}).await).await?.runs,
        None => benchfleet_controller::convert::run_list(&open_store(&data_dir(cli.data_dir.as_deref()))?)?,
    };
    if cli.json {
        println!("{}", serde_json::Value::Array(runs.iter().map(run_json).collect()));
    } else {
        print_runs(&runs);
    }
    Ok(0)
}

/// `jobs RUN`: through the controller, or from the local store.
async fn jobs(cli: &Cli, controller: Option<&Target>, run_id: &str) -> anyhow::Result<i32> {
    let jobs = match controller {
        Some(_) => {
            let request = pb::ListJobsRequest { run_id: run_id.to_owned() };
            remote(controller, async |c| c.list_jobs(request).await).await?.jobs
        }
        None => {
            let id: RunId = run_id.parse().map_err(anyhow::Error::msg)?;
            let store = open_store(&data_dir(cli.data_dir.as_deref()))?;
            store
                .run(id)?
                .ok_or_else(|| StatusError::new(tonic::Code::NotFound, format!("run {id} does not exist")))?;
            let groups = store.groups(id)?;
            let stats = store.attempt_stats(id)?;
            store
                .jobs(id)?
                .iter()
                .map(|j| benchfleet_controller::convert::job_info(j, groups.iter().find(|g| g.id == j.group), &stats))
                .collect()
        }
    };
    if cli.json {
        println!("{}", serde_json::Value::Array(jobs.iter().map(job_json).collect()));
    } else {
        print_jobs(&jobs);
    }
    Ok(0)
}

/// What the matrix's dataset files hold that the operator should know; the
/// controller repeats the matrix's own warnings when it accepts the run.
fn note_datasets(sub: &client::Submission) {
    for note in &sub.dataset_notes {
        eprintln!("warning: {note}");
    }
}

fn open_store(dir: &Path) -> anyhow::Result<SledStore> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create the data directory {}", dir.display()))?;
    Ok(SledStore::open(&dir.join("store"))?)
}

/// Where an export goes: stdout, or a file that appears (under its name)
/// only once the export is complete.
enum ExportOutput {
    Stdout(std::io::BufWriter<std::io::Stdout>),
    File { path: PathBuf, partial: PathBuf, file: std::io::BufWriter<std::fs::File> },
}

impl ExportOutput {
    fn open(path: Option<&Path>) -> anyhow::Result<ExportOutput> {
        let Some(path) = path else {
            return Ok(ExportOutput::Stdout(std::io::BufWriter::with_capacity(1 << 20, std::io::stdout())));
        };
        let mut partial = path.as_os_str().to_owned();
        partial.push(".partial");
        let partial = PathBuf::from(partial);
        let file = std::fs::File::create(&partial).with_context(|| format!("cannot create {}", partial.display()))?;
        Ok(ExportOutput::File {
            path: path.to_path_buf(),
            partial,
            file: std::io::BufWriter::with_capacity(1 << 20, file),
        })
    }

    fn finish(self) -> anyhow::Result<()> {
        match self {
            ExportOutput::Stdout(mut out) => out.flush().context("cannot write the export to stdout"),
            ExportOutput::File { path, partial, file } => {
                let done = file
                    .into_inner()
                    .map_err(|e| e.into_error())
                    .and_then(|f| f.sync_all())
                    .and_then(|()| std::fs::rename(&partial, &path));
                if let Err(e) = done {
                    let _ = std::fs::remove_file(&partial);
                    return Err(e).with_context(|| format!("cannot write {}", path.display()));
                }
                Ok(())
            }
        }
    }

    /// Leaves no part of a failed export behind (stdout has had what it had).
    fn abandon(self) {
        if let ExportOutput::File { partial, file, .. } = self {
            drop(file);
            let _ = std::fs::remove_file(&partial);
        }
    }
}

impl std::io::Write for ExportOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            ExportOutput::Stdout(out) => out.write(buf),
            ExportOutput::File { file, .. } => file.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            ExportOutput::Stdout(out) => out.flush(),
            ExportOutput::File { file, .. } => file.flush(),
        }
    }
}

/// `export`: from the controller's store when given one, else the local.
async fn export(controller: Option<&Target>, dir: &Path, run_id: &str, output: Option<&Path>) -> anyhow::Result<i32> {
    use benchfleet_controller::export::{self, Counts};
    // A bad id is refused before a file is made.
    let id: RunId = run_id.parse().map_err(anyhow::Error::msg)?;
    let mut c = match controller {
        Some(url) => Some(client::connect(url).await?),
        None => None,
    };
    let mut out = ExportOutput::open(output)?;
    let written: anyhow::Result<Counts> = async {
        let Some(c) = c.as_mut() else {
            let store = open_store(dir)?;
            return Ok(export::export(&store, id, &mut out)?);
        };
        let mut stream = c.export_run(pb::ExportRunRequest { run_id: id.to_string() }).await.map_err(client::status)?;
        let stream = stream.get_mut();
        // The last bytes, for the trailer's counts.
        let mut tail: Vec<u8> = Vec::new();
        while let Some(chunk) = stream.message().await.map_err(client::status)? {
            out.write_all(&chunk.data).context("cannot write the export")?;
            tail.extend_from_slice(&chunk.data);
            if tail.len() > 64 << 10 {
                tail.drain(..tail.len() - (4 << 10));
            }
        }
        let last = tail.trim_ascii_end().rsplit(|b| *b == b'\n').next().unwrap_or_default();
        export::trailer(last).context("the controller's export ended without its trailer; export the run again")
    }
    .await;
    match written {
        Ok(counts) => {
            out.finish()?;
            let to = output.map(|p| format!(" to {}", p.display())).unwrap_or_default();
            eprintln!(
                "run {id} exported{to}: {} groups, {} jobs, {} summaries, {} records",
                counts.groups, counts.jobs, counts.summaries, counts.records
            );
            Ok(0)
        }
        Err(e) => {
            out.abandon();
            Err(e)
        }
    }
}

/// `import` into the local store; a line that is wrong is named with the
/// file's name.
fn import_local(dir: &Path, path: &str) -> anyhow::Result<pb::ImportRunResponse> {
    use benchfleet_controller::export::{self, ImportError};
    let name = client::shown(path);
    let input: Box<dyn std::io::Read> = if path == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(std::fs::File::open(path).with_context(|| format!("cannot read {name}"))?)
    };
    let store = open_store(dir)?;
    let imported = export::import(&store, std::io::BufReader::with_capacity(1 << 20, input)).map_err(|e| match e {
        ImportError::Store(e) => anyhow::Error::from(e),
        other => anyhow::anyhow!("{name}: {other}"),
    })?;
    Ok(benchfleet_controller::convert::imported(&imported))
}

/// The run's id on stdout (or the whole answer as JSON); what else to know
/// on stderr.
fn print_imported(i: &pb::ImportRunResponse, path: &str, json: bool) {
    if json {
        let files: Vec<serde_json::Value> =
            i.missing_files.iter().map(|f| json!({ "path": f.name, "sha256": f.sha256 })).collect();
        println!(
            "{}",
            json!({
                "run_id": i.run_id, "original_run_id": i.original_run_id, "groups": i.groups, "jobs": i.jobs,
                "records": i.records, "missing_files": files,
            })
        );
        return;
    }
    let renumbered = if i.run_id == i.original_run_id {
        String::new()
    } else {
        format!(" (it was run {}; that id is taken here)", i.original_run_id)
    };
    eprintln!(
        "{} imported as run {}{renumbered}: {} groups, {} jobs, {} records",
        client::shown(path),
        i.run_id,
        i.groups,
        i.jobs,
        i.records
    );
    if !i.missing_files.is_empty() {
        let files: Vec<String> = i.missing_files.iter().map(|f| format!("{} ({})", f.name, f.sha256)).collect();
        eprintln!(
            "warning: the run names files this store does not hold: {}; its report needs none of them, a retry of \
             its jobs here needs them all",
            files.join(", ")
        );
    }
    println!("{}", i.run_id);
}

fn announce(submitted: &pb::SubmitRunResponse) {
    eprintln!("run {} submitted: {} jobs", submitted.run_id, submitted.jobs);
    for w in &submitted.warnings {
        eprintln!("warning: {w}");
    }
}

/// SIGINT or SIGTERM.
async fn interrupted() {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

async fn run_local(matrix: &Path, dir: &Path, json: bool) -> anyhow::Result<i32> {
    // Fail on a bad matrix before starting anything.
    let sub = client::submission(matrix, Some("process"))?;
    note_datasets(&sub);
    let gpu = sub.matrix.gpu.clone().unwrap_or_else(|| "H200".to_owned());
    let store: Arc<dyn Store> = Arc::new(open_store(dir)?);
    eprintln!("data directory: {}", dir.display());
    let work_dir = dir.join("agent");
    // One simulated host with a job's GPUs: jobs run one after another on it.
    let gpus = sub.matrix.gpus_per_job.max(1);
    let fleet = LocalFleet::start(store, |url| simulated_agent(url, &gpu, gpus, work_dir)).await?;
    let url = Target::plain(fleet.url.clone());
    let mut submitted_id = None;
    let work = async {
        let mut c = client::connect(&url).await?;
        let submitted = client::submit(&mut c, sub).await?;
        announce(&submitted);
        submitted_id = Some(submitted.run_id.clone());
        follow(&url, &submitted.run_id, Duration::from_secs(10), json, true).await
    };
    let result = tokio::select! {
        r = work => r,
        () = interrupted() => {
            // Interrupting local mode ends its run: nothing resumes it later.
            eprintln!("interrupted: stopping the engines and loadgen");
            if let Some(run) = &submitted_id {
                let note = pb::CancelRunRequest { run_id: run.clone(), reason: "interrupted".into(), by: whoami() };
                if let Ok(mut c) = client::connect(&url).await {
                    let _ = c.cancel_run(note).await;
                }
            }
            fleet.stop().await;
            return Ok(EXIT_INTERRUPTED);
        }
    };
    fleet.stop().await;
    let code = result?;
    eprintln!("data directory: {}", dir.display());
    Ok(code)
}

/// A run's report in a format, from the controller or the local store, and
/// whether it recommends a configuration.
async fn report_text(
    cli: &Cli,
    controller: Option<&Target>,
    run_id: &str,
    format: Format,
) -> anyhow::Result<(String, bool)> {
    Ok(match controller {
        Some(url) => {
            let r = client::connect(url)
                .await?
                .get_report(pb::GetReportRequest { run_id: run_id.to_owned(), format: format.name().to_owned() })
                .await
                .map_err(client::status)?
                .into_inner();
            (r.text, !r.recommended.is_empty())
        }
        None => {
            let id: RunId = run_id.parse().map_err(anyhow::Error::msg)?;
            let store = open_store(&data_dir(cli.data_dir.as_deref()))?;
            let doc = document(&store, id, &|_, _| {})?;
            (report::render_as(&doc, format), doc.recommendation.is_some())
        }
    })
}

/// A run's report as data: from a JSON report file when `run` names one,
/// else from the controller or the local store.
async fn report_doc(cli: &Cli, controller: Option<&Target>, run: &str) -> anyhow::Result<ReportDoc> {
    let path = Path::new(run);
    let (text, from) = if path.is_file() {
        (std::fs::read_to_string(path).with_context(|| format!("cannot read {run}"))?, run.to_owned())
    } else {
        (report_text(cli, controller, run, Format::Json).await?.0, format!("run {run}'s report"))
    };
    let value: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{from} is not a JSON report"))?;
    let schema = value.get("schema").and_then(|s| s.as_str()).unwrap_or("");
    if schema != report::doc::SCHEMA {
        anyhow::bail!("{from} has schema {schema:?}; this benchfleet reads {:?}", report::doc::SCHEMA);
    }
    serde_json::from_value(value).with_context(|| format!("{from} does not match {}", report::doc::SCHEMA))
}

/// Watches a run to its end, then (with `report`) prints its report; the
/// exit code says how it ended.
async fn follow(url: &Target, run_id: &str, reconnect_for: Duration, json: bool, report: bool) -> anyhow::Result<i32> {
    let bar = (!json).then(progress_bar).flatten();
    let mut last_line = String::new();
    let watching = client::watch(url, run_id, reconnect_for, |p| {
        let line = progress_line(p);
        if let Some(bar) = &bar {
            if let Some(r) = &p.run {
                bar.set_length(r.jobs_total);
                bar.set_position(r.jobs_done);
            }
            bar.set_message(line);
        } else if json {
            println!("{}", progress_json(p));
        } else if line != last_line {
            eprintln!("{line}");
            last_line = line;
        }
    });
    let last = tokio::select! {
        r = watching => r?,
        () = interrupted(), if !report => return Ok(EXIT_INTERRUPTED),
    };
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let run = last.run.unwrap_or_default();
    let mut recommended = true;
    if report {
        let r = client::connect(url)
            .await?
            .get_report(pb::GetReportRequest { run_id: run_id.to_owned(), format: String::new() })
            .await
            .map_err(client::status)?
            .into_inner();
        print!("{}", r.text);
        println!("run id: {run_id}");
        recommended = !r.recommended.is_empty();
    } else if !json {
        eprintln!("run {run_id} {}: {}/{} jobs succeeded", run.state, run.jobs_succeeded, run.jobs_total);
    }
    let all_succeeded = run.jobs_succeeded == run.jobs_total && run.state == "finished";
    Ok(if all_succeeded && recommended { 0 } else { EXIT_FAILED_JOBS })
}

/// A bar on a terminal; `None` elsewhere, where plain lines are printed.
fn progress_bar() -> Option<indicatif::ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new(0);
    let style = indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} jobs, {msg}")
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    bar.set_style(style);
    Some(bar)
}

/// One line of a run's progress: done of total, by state, stage, ETA, and
/// why it waits.
pub fn progress_line(p: &pb::RunProgress) -> String {
    let run = p.run.clone().unwrap_or_default();
    let mut line = format!("jobs {}/{} done, {} failed", run.jobs_done, run.jobs_total, run.jobs_failed);
    if run.stage > 1 {
        line = format!("stage {}: {line}", run.stage);
    }
    let active: Vec<String> = ["running", "starting_engine", "assigned", "pending"]
        .iter()
        .filter_map(|s| p.jobs_by_state.get(*s).filter(|n| **n > 0).map(|n| format!("{n} {}", s.replace('_', " "))))
        .collect();
    if !active.is_empty() {
        line.push_str(&format!(" ({})", active.join(", ")));
    }
    if let Some(eta) = p.eta_s {
        line.push_str(&format!(
            ", stage ETA {}",
            benchfleet_controller::sched::human(Duration::from_secs_f64(eta.max(0.0)))
        ));
    }
    let busy: Vec<String> =
        p.agents.iter().filter(|a| a.running > 0).map(|a| format!("{} {}", a.name, a.running)).collect();
    if !busy.is_empty() {
        let shown = busy.iter().take(4).cloned().collect::<Vec<_>>().join(", ");
        let more = if busy.len() > 4 { format!(" and {} more agents", busy.len() - 4) } else { String::new() };
        line.push_str(&format!("; running on {shown}{more}"));
    }
    for w in &p.waiting {
        line.push_str(&format!("; waiting: {w}"));
    }
    line
}

fn progress_json(p: &pb::RunProgress) -> serde_json::Value {
    json!({
        "run": p.run.as_ref().map(run_json),
        "finished": p.finished,
        "jobs_by_state": p.jobs_by_state,
        "agents": p.agents.iter().map(|a| json!({ "agent_id": a.agent_id, "name": a.name, "running": a.running, "done": a.done })).collect::<Vec<_>>(),
        "waiting": p.waiting,
        "eta_s": p.eta_s,
    })
}

fn run_json(r: &pb::RunInfo) -> serde_json::Value {
    json!({
        "run_id": r.run_id, "name": r.name, "state": r.state, "jobs_total": r.jobs_total, "jobs_done": r.jobs_done,
        "jobs_succeeded": r.jobs_succeeded, "jobs_failed": r.jobs_failed, "jobs_cancelled": r.jobs_cancelled,
        "created_unix_ms": r.created_unix_ms, "ended_unix_ms": (r.ended_unix_ms != 0).then_some(r.ended_unix_ms),
        "stage": r.stage, "note": (!r.note.is_empty()).then_some(&r.note),
    })
}

fn job_json(j: &pb::JobInfo) -> serde_json::Value {
    json!({
        "job": j.job, "group": j.group, "config": j.config, "profile": j.profile, "repeat": j.repeat, "stage": j.stage,
        "state": j.state, "agent_id": (!j.agent_id.is_empty()).then_some(&j.agent_id), "error": (!j.error.is_empty()).then_some(&j.error),
        "attempts": j.attempts.iter().map(|a| json!({
            "attempt": a.attempt, "epoch": a.epoch, "agent_id": a.agent_id, "agent_name": a.agent_name, "outcome": a.outcome,
            "reason": (!a.reason.is_empty()).then_some(&a.reason), "started_unix_ms": a.started_unix_ms,
            "ended_unix_ms": (a.ended_unix_ms != 0).then_some(a.ended_unix_ms), "records_stored": a.records_stored,
            "requests_sent": a.requests_sent, "records_removed": a.records_removed,
        })).collect::<Vec<_>>(),
    })
}

fn agent_json(a: &pb::AgentInfo) -> serde_json::Value {
    json!({
        "agent_id": a.agent_id, "name": a.name, "hostname": a.hostname, "state": a.state, "connected": a.connected,
        "lease_age_ms": a.lease_age_ms, "drained": a.drained, "drain_note": (!a.drain_note.is_empty()).then_some(&a.drain_note),
        "leaving": a.leaving, "version": a.version, "epoch": a.epoch,
        "certificate_expires_unix_ms": (a.certificate_expires_unix_ms > 0).then_some(a.certificate_expires_unix_ms),
        "revoked_note": (!a.revoked_note.is_empty()).then_some(&a.revoked_note),
        "running": a.running.iter().map(|g| json!({ "run_id": g.run_id, "group": g.group })).collect::<Vec<_>>(),
        "gpus": a.gpus.iter().map(|g| json!({
            "index": g.index, "uuid": g.uuid, "name": g.name, "usable": g.usable, "reasons": g.reasons,
            "memory_total_bytes": g.memory_total_bytes, "driver_version": g.driver_version, "cuda_driver_version": g.cuda_driver_version,
        })).collect::<Vec<_>>(),
    })
}

fn print_runs(runs: &[pb::RunInfo]) {
    println!("{:<8} {:<32} {:<24} {:>11} {:>7}", "RUN", "NAME", "STATE", "JOBS", "FAILED");
    for r in runs {
        println!(
            "{:<8} {:<32} {:<24} {:>5}/{:<5} {:>7}",
            r.run_id, r.name, r.state, r.jobs_done, r.jobs_total, r.jobs_failed
        );
    }
}

fn print_jobs(jobs: &[pb::JobInfo]) {
    println!(
        "{:<5} {:<28} {:<12} {:>3} {:<16} {:<10} {:>8} {:>15}  ERROR",
        "JOB", "CONFIG", "PROFILE", "REP", "STATE", "AGENT", "ATTEMPTS", "RECORDS/SENT"
    );
    for j in jobs {
        let last = j.attempts.last();
        let records = last.map_or_else(String::new, |a| format!("{}/{}", a.records_stored, a.requests_sent));
        println!(
            "{:<5} {:<28} {:<12} {:>3} {:<16} {:<10} {:>8} {:>15}  {}",
            j.job,
            j.config,
            j.profile,
            j.repeat,
            j.state,
            j.agent_id,
            j.attempts.len(),
            records,
            j.error
        );
        if j.attempts.len() > 1 {
            for a in &j.attempts {
                let reason = if a.reason.is_empty() { String::new() } else { format!(": {}", a.reason) };
                let records = if a.records_removed {
                    format!("records removed, {} sent", a.requests_sent)
                } else {
                    format!("{} records of {} sent", a.records_stored, a.requests_sent)
                };
                println!(
                    "      attempt {} on {} (epoch {}): {}{reason}; {records}",
                    a.attempt, a.agent_name, a.epoch, a.outcome
                );
            }
        }
    }
}

fn print_agents(agents: &[pb::AgentInfo]) {
    println!("{:<20} {:<10} {:<13} {:>9} {:<8} {:>6}  HOST", "NAME", "ID", "STATE", "LEASE", "DRAINED", "GROUPS");
    for a in agents {
        let lease = a.lease_age_ms.map_or_else(|| "-".to_owned(), |ms| format!("{:.1}s", ms as f64 / 1e3));
        let state = if a.leaving { format!("{} leaving", a.state) } else { a.state.clone() };
        println!(
            "{:<20} {:<10} {:<13} {:>9} {:<8} {:>6}  {}",
            a.name,
            a.agent_id,
            state,
            lease,
            if a.drained { "yes" } else { "no" },
            a.running.len(),
            a.hostname
        );
        if a.drained && !a.drain_note.is_empty() {
            println!("  drained {}", a.drain_note);
        }
        if !a.revoked_note.is_empty() {
            println!("  revoked {}", a.revoked_note);
        } else if a.certificate_expires_unix_ms > 0 {
            let until = i64::try_from(a.certificate_expires_unix_ms).unwrap_or(i64::MAX);
            println!("  certificate until {}", benchfleet_study::report::words::utc(until));
        }
        for g in &a.gpus {
            let verdict = if g.usable { "usable".to_owned() } else { format!("not used: {}", g.reasons.join("; ")) };
            println!("  GPU {} {} {}: {verdict}", g.index, g.name, g.uuid);
        }
    }
}
