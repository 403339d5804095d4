//! One configuration precedence for both daemons: a flag, then its
//! environment variable, then the `--config` file, then the default.
//!
//! Every long flag of the daemon's command is a key of the file, spelt with
//! `_` for `-` (`--lease-ttl-ms` is `lease_ttl_ms`). clap parses the command
//! line and the environment as it always does; the file's values are then
//! given to clap as flags for exactly the arguments whose value came from a
//! default or from nowhere (`ArgMatches::value_source`), and the whole is
//! parsed again, so one parser checks every value whatever its source. A
//! key the command does not have is an error naming the key and the file,
//! as is a value of the wrong kind. Tables a daemon reads itself (the
//! agent's `[gpu]` and `[engines]`) are named in [`Spec::tables`] and left
//! to it.
//!
//! `--print-config` shows the merged result as TOML, each value's source as
//! a comment above it and secrets (arguments whose environment value clap
//! hides) as `"***"`.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, Command};

/// How a daemon's command reads its file.
#[derive(Clone, Copy, Debug)]
pub struct Spec<'a> {
    /// The id of the argument that names the file (`config`).
    pub config: &'a str,
    /// The id of the flag that prints the merged configuration.
    pub print: &'a str,
    /// The subcommand whose arguments are the file's keys (the daemon's
    /// `run`); `None`: the command's own. Another subcommand takes the keys
    /// it has and leaves the others.
    pub daemon: Option<&'a str>,
    /// Top-level tables the daemon reads itself.
    pub tables: &'a [&'a str],
}

/// What went wrong, naming the file and the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read the config file {}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("the config file {} is not TOML: {message}", path.display())]
    Syntax { path: PathBuf, message: String },
    #[error("{}: unknown key `{key}`{hint}", path.display())]
    Unknown { path: PathBuf, key: String, hint: String },
    #[error("{}: key `{key}`: {message}", path.display())]
    Value { path: PathBuf, key: String, message: String },
    #[error(transparent)]
    Clap(#[from] clap::Error),
}

/// Where a value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    Flag,
    Env(String),
    File(PathBuf),
    Default,
    Unset,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Flag => f.write_str("from the command line"),
            Source::Env(name) => write!(f, "from the environment ({name})"),
            Source::File(path) => write!(f, "from {}", path.display()),
            Source::Default => f.write_str("default"),
            Source::Unset => f.write_str("unset"),
        }
    }
}

/// One key of the merged configuration.
#[derive(Clone, Debug)]
pub struct Entry {
    pub key: String,
    /// The values as given (one unless the flag repeats).
    pub values: Vec<String>,
    pub source: Source,
    /// Printed as `"***"`.
    pub secret: bool,
    /// A switch: printed as a TOML boolean.
    pub switch: bool,
}

/// The parsed arguments' provenance: what `--print-config` prints.
#[derive(Clone, Debug)]
pub struct Layered {
    pub command: String,
    pub file: Option<PathBuf>,
    pub entries: Vec<Entry>,
    /// The file's own tables ([`Spec::tables`]), as read.
    pub tables: toml::Table,
    /// Whether the print flag was given.
    pub print: bool,
}

/// Parses the process's arguments, environment and config file into `P`;
/// exits as clap does on `--help`, `--version` or a bad command line.
pub fn parse<P: clap::Parser>(spec: &Spec<'_>) -> Result<(P, Layered), ConfigError> {
    parse_from(spec, std::env::args_os())
}

/// [`parse`] of the given arguments (the first is the program's name).
pub fn parse_from<P, I, T>(spec: &Spec<'_>, argv: I) -> Result<(P, Layered), ConfigError>
where
    P: clap::Parser,
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let argv: Vec<OsString> = argv.into_iter().map(Into::into).collect();
    let root = P::command();
    let first = root.clone().try_get_matches_from(&argv).unwrap_or_else(|e| e.exit());
    let (leaf, leaf_m) = leaf(&root, &first);
    let schema = match spec.daemon {
        Some(name) => root.find_subcommand(name).unwrap_or(leaf),
        None => &root,
    };
    let keys: BTreeSet<String> = keyed(schema).map(|(key, _)| key).collect();
    let path = raw_one(leaf_m, spec.config).map(PathBuf::from);
    let mut extra = Vec::new();
    let mut from_file = BTreeSet::new();
    let mut tables = toml::Table::new();
    if let Some(path) = &path {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.clone(), source })?;
        let file: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| ConfigError::Syntax { path: path.clone(), message: e.to_string() })?;
        let here: BTreeMap<String, &clap::Arg> = keyed(leaf).collect();
        for (key, value) in file {
            if spec.tables.contains(&key.as_str()) {
                if !value.is_table() {
                    return Err(value_error(path, &key, format!("expected a table [{key}]")));
                }
                tables.insert(key, value);
                continue;
            }
            if !keys.contains(&key) || key == spec.config || key == spec.print {
                let known = keys.iter().cloned().chain(spec.tables.iter().map(|t| (*t).to_owned()));
                let known: Vec<String> = known.filter(|k| k != spec.config && k != spec.print).collect();
                let hint = match closest(&key, &known) {
                    Some(near) => format!(" (did you mean `{near}`?)"),
                    None => String::new(),
                };
                return Err(ConfigError::Unknown { path: path.clone(), key, hint });
            }
            let Some(arg) = here.get(&key) else { continue };
            let id = arg.get_id().as_str();
            if matches!(leaf_m.value_source(id), Some(ValueSource::CommandLine | ValueSource::EnvVariable)) {
                continue;
            }
            let long = arg.get_long().unwrap_or(id);
            let given = flags_for(arg, long, &value).map_err(|message| value_error(path, &key, message))?;
            // A switch the file sets to its default gives no flag, but is
            // still the file's.
            from_file.insert(id.to_owned());
            extra.extend(given);
        }
    }
    let matches = if extra.is_empty() {
        first
    } else {
        let mut argv = argv;
        argv.extend(extra);
        match root.clone().try_get_matches_from(&argv) {
            Ok(m) => m,
            Err(e) => {
                let path = path.as_deref().unwrap_or(Path::new(""));
                return Err(from_file_error(e, leaf, path, &from_file));
            }
        }
    };
    let parsed = <P as clap::FromArgMatches>::from_arg_matches(&matches)?;
    let (leaf, leaf_m) = self::leaf(&root, &matches);
    let entries = keyed(leaf)
        .filter(|(key, _)| keys.contains(key) && key != spec.config && key != spec.print)
        .map(|(key, arg)| entry(key, arg, leaf_m, &from_file, path.as_deref()))
        .collect();
    let print = leaf_m.try_get_one::<bool>(spec.print).ok().flatten().copied().unwrap_or(false);
    let layered = Layered { command: root.get_name().to_owned(), file: path, entries, tables, print };
    Ok((parsed, layered))
}

impl Layered {
    /// The merged configuration as TOML: a file `--config` reads back.
    pub fn render(&self) -> String {
        let mut out = format!(
            "# {}'s configuration: a flag, then its environment variable, then {}, then the default.\n",
            self.command,
            match &self.file {
                Some(path) => path.display().to_string(),
                None => "the config file (none given)".to_owned(),
            }
        );
        out.push('\n');
        for e in &self.entries {
            if e.values.is_empty() {
                out.push_str(&format!("# {} (unset)\n", e.key));
                continue;
            }
            let value = |v: &str| {
                if e.secret {
                    "\"***\"".to_owned()
                } else if e.switch {
                    v.to_owned()
                } else {
                    scalar(v)
                }
            };
            let text = match e.values.as_slice() {
                [one] => value(one),
                many => format!("[{}]", many.iter().map(|v| value(v)).collect::<Vec<_>>().join(", ")),
            };
            out.push_str(&format!("{} = {text}  # {}\n", e.key, e.source));
        }
        for (name, table) in &self.tables {
            out.push_str(&format!("\n# [{name}] from the config file, as read (what it omits takes its default)\n"));
            let mut one = toml::Table::new();
            one.insert(name.clone(), table.clone());
            out.push_str(&toml::to_string(&one).unwrap_or_default());
        }
        out
    }
}

/// The innermost subcommand given, and its matches.
fn leaf<'c, 'm>(mut cmd: &'c Command, mut m: &'m ArgMatches) -> (&'c Command, &'m ArgMatches) {
    while let Some((name, sub)) = m.subcommand() {
        match cmd.find_subcommand(name) {
            Some(c) => (cmd, m) = (c, sub),
            None => break,
        }
    }
    (cmd, m)
}

/// A command's arguments by key: the long flag with `_` for `-`.
fn keyed(cmd: &Command) -> impl Iterator<Item = (String, &clap::Arg)> {
    cmd.get_arguments()
        .filter(|a| !matches!(a.get_action(), ArgAction::Help | ArgAction::Version | ArgAction::HelpShort))
        .filter_map(|a| Some((a.get_long()?.replace('-', "_"), a)))
}

fn raw_one(m: &ArgMatches, id: &str) -> Option<OsString> {
    m.try_get_raw(id).ok().flatten().and_then(|mut v| v.next()).map(ToOwned::to_owned)
}

fn value_error(path: &Path, key: &str, message: String) -> ConfigError {
    ConfigError::Value { path: path.to_owned(), key: key.to_owned(), message }
}

/// The flags that give `arg` the file's value (clap's parse of them then
/// checks it, and [`from_file_error`] names the key).
fn flags_for(arg: &clap::Arg, long: &str, value: &toml::Value) -> Result<Vec<OsString>, String> {
    let action = arg.get_action();
    if matches!(action, ArgAction::SetTrue | ArgAction::SetFalse) {
        let on = value.as_bool().ok_or_else(|| format!("expected true or false, not {value}"))?;
        let set = matches!(action, ArgAction::SetTrue) == on;
        return Ok(if set { vec![format!("--{long}").into()] } else { Vec::new() });
    }
    let values: Vec<&toml::Value> = match value {
        toml::Value::Array(items) if matches!(action, ArgAction::Append) => items.iter().collect(),
        toml::Value::Array(_) => return Err("expected one value, not a list".to_owned()),
        one => vec![one],
    };
    values
        .into_iter()
        .map(|v| {
            let text = match v {
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(_) | toml::Value::Float(_) | toml::Value::Boolean(_) => v.to_string(),
                other => return Err(format!("expected a string or a number, not {}", other.type_str())),
            };
            Ok(format!("--{long}={text}").into())
        })
        .collect()
}

/// A parse error of the file's values, naming the key its flag stands for.
fn from_file_error(e: clap::Error, cmd: &Command, path: &Path, injected: &BTreeSet<String>) -> ConfigError {
    use clap::error::{ContextKind, ContextValue};
    let first = e.to_string().lines().next().unwrap_or_default().trim_start_matches("error: ").to_owned();
    if let Some(ContextValue::String(shown)) = e.get(ContextKind::InvalidArg) {
        for (key, arg) in keyed(cmd) {
            let long = format!("--{}", arg.get_long().unwrap_or_default());
            let named =
                shown == &long || shown.starts_with(&format!("{long} ")) || shown.starts_with(&format!("{long}="));
            if named && injected.contains(arg.get_id().as_str()) {
                return value_error(path, &key, first);
            }
        }
    }
    ConfigError::Value { path: path.to_owned(), key: "(the file's values)".to_owned(), message: first }
}

fn entry(key: String, arg: &clap::Arg, m: &ArgMatches, from_file: &BTreeSet<String>, path: Option<&Path>) -> Entry {
    let id = arg.get_id().as_str();
    let switch = matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse);
    let values: Vec<String> = m
        .try_get_raw(id)
        .ok()
        .flatten()
        .map(|v| v.map(|s| s.to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    let source = match (m.value_source(id), path) {
        _ if values.is_empty() => Source::Unset,
        (_, Some(path)) if from_file.contains(id) => Source::File(path.to_owned()),
        (Some(ValueSource::CommandLine), _) => Source::Flag,
        (Some(ValueSource::EnvVariable), _) => {
            Source::Env(arg.get_env().map(|e| e.to_string_lossy().into_owned()).unwrap_or_default())
        }
        _ => Source::Default,
    };
    let secret = arg.is_hide_env_values_set() || key.contains("token") || key.contains("secret");
    Entry { key, values, source, secret, switch }
}

/// A value as TOML: a number as a number, anything else a string.
fn scalar(v: &str) -> String {
    if v.parse::<i64>().is_ok() || (v.contains('.') && v.parse::<f64>().is_ok_and(f64::is_finite)) {
        v.to_owned()
    } else {
        toml::Value::String(v.to_owned()).to_string()
    }
}

/// The known key nearest to a misspelt one, if it is near.
fn closest<'k>(key: &str, known: impl IntoIterator<Item = &'k String>) -> Option<&'k str> {
    known
        .into_iter()
        .map(|k| (distance(key, k), k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 4))
        .min()
        .map(|(_, k)| k.as_str())
}

/// Levenshtein distance.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let here = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(row[j + 1] + 1);
            prev = here;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests;
