//! Loading [`Config`]: four layers merged by `figment`, in order of increasing precedence:
//! the defaults, the TOML file, the `UNIMESH_*` environment and the command-line flags.
//!
//! figment keeps, for every value of the merged tree, the layer it came from; so whatever
//! refuses a value (serde: an unknown key, a wrong type, a value out of its type's range, an
//! unknown variant; a section's own check afterwards) is reported with the key and that
//! layer: the file's path, the variable's name, the flag, or "default".
//!
//! The file is strict (a value must already have the key's type: `max_wait_ms = "5"` is
//! refused). Environment variables and flags are text: each is parsed with the type of the
//! default it replaces, here, so a bad one names the variable or flag; an `UNIMESH_*`
//! variable that is no key (nor one of the project's other variables) is refused.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use figment::error::{Actual, Kind};
use figment::providers::{Format, Toml};
use figment::value::{Dict, Map};
use figment::{Figment, Metadata, Profile, Provider};
use toml::{Table, Value};

use super::{auth, Config, ConfigError, Invalid, DEDUP_TOPICS_KEY};

/// Prefix of every environment variable read as configuration.
pub const ENV_PREFIX: &str = "UNIMESH_";

/// The environment variable naming the configuration file.
pub const ENV_CONFIG_FILE: &str = "UNIMESH_CONFIG";

/// `UNIMESH_*` variables that the project's tools read (the simulation harnesses, the
/// black-box tests and their scripts); they are not configuration keys and not refused.
/// Every `UNIMESH_TEST_*` variable is the tests' too. The client subcommands' variables
/// (`cli::ENV`) never reach [`load`].
const ENV_NOT_CONFIG: &[&str] = &[
    ENV_CONFIG_FILE,
    "UNIMESH_BIN",
    "UNIMESH_BLESS",
    "UNIMESH_CHROMIUM",
    "UNIMESH_GROUP_DETERMINISM_SEEDS",
    "UNIMESH_GROUP_SEEDS",
    "UNIMESH_KAFKA_SEEDS",
    "UNIMESH_NO_CORE_CHECK",
    "UNIMESH_SEED",
    "UNIMESH_SIZE",
    "UNIMESH_STATE_CRASH_CHILD_DIR",
    "UNIMESH_TANSU",
    "UNIMESH_TRACE",
    "UNIMESH_WORLD",
];

/// Prefix of the black-box tests' own variables.
const ENV_TEST_PREFIX: &str = "UNIMESH_TEST_";

/// The keys of the pass-through tables: any property name is allowed in them.
const KAFKA_PROPERTY_TABLES: [&str; 3] = ["kafka.properties", "kafka.producer", "kafka.consumer"];

/// Whether `key` names one of the pass-through tables.
fn is_property_table(key: &str) -> bool {
    KAFKA_PROPERTY_TABLES.contains(&key)
}

/// Flags given on the command line: each overrides every other source.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overrides {
    pub config: Option<PathBuf>,
    pub http: Option<String>,
    pub admin: Option<String>,
    pub data: Option<PathBuf>,
    /// `--storage`: `storage.backend`.
    pub storage: Option<String>,
    /// `--kafka-brokers`: `kafka.brokers`.
    pub kafka_brokers: Option<String>,
    /// `--kafka-instance`: `kafka.instance`.
    pub kafka_instance: Option<String>,
    /// `--insecure`: `server.insecure = true`.
    pub insecure: bool,
    /// `--tls-cert`: `server.tls.cert`.
    pub tls_cert: Option<PathBuf>,
    /// `--tls-key`: `server.tls.key`.
    pub tls_key: Option<PathBuf>,
}

/// The key each flag sets, and the flag's name.
const FLAGS: [(&str, &str); 9] = [
    ("http", "http"),
    ("admin", "admin"),
    ("data", "data"),
    ("storage.backend", "storage"),
    ("kafka.brokers", "kafka-brokers"),
    ("kafka.instance", "kafka-instance"),
    ("server.insecure", "insecure"),
    ("server.tls.cert", "tls-cert"),
    ("server.tls.key", "tls-key"),
];

impl Overrides {
    /// The flags given, as (key, text), in the order of [`FLAGS`].
    fn given(&self) -> Vec<(&'static str, String)> {
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        let values = [
            self.http.clone(),
            self.admin.clone(),
            path(&self.data),
            self.storage.clone(),
            self.kafka_brokers.clone(),
            self.kafka_instance.clone(),
            self.insecure.then(|| "true".to_owned()),
            path(&self.tls_cert),
            path(&self.tls_key),
        ];
        FLAGS
            .iter()
            .zip(values)
            .filter_map(|((key, _), v)| Some((*key, v?)))
            .collect()
    }
}

/// The result of [`load`]: the configuration and the file it was read from, if any (for the
/// startup log).
#[derive(Clone, Debug)]
pub struct Loaded {
    pub config: Config,
    pub file: Option<PathBuf>,
}

/// Builds the configuration from the defaults, the file (`overrides.config`, else
/// `UNIMESH_CONFIG`), the given environment and the flags, and checks it
/// ([`Config::validate`]).
pub fn load<I>(overrides: &Overrides, env: I) -> Result<Loaded, ConfigError>
where
    I: IntoIterator<Item = (String, String)>,
{
    let env: BTreeMap<String, String> = env
        .into_iter()
        .filter(|(k, _)| k.starts_with(ENV_PREFIX))
        .collect();
    let defaults = default_table();
    let file = overrides
        .config
        .clone()
        .or_else(|| env.get(ENV_CONFIG_FILE).map(PathBuf::from));

    let mut figment = Figment::from(Layer::defaults(&defaults));
    if let Some(path) = &file {
        // Read and parsed here first, so an unreadable or malformed file is one error
        // naming it (figment would report either as a message without the path).
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ReadFile {
            path: path.clone(),
            source,
        })?;
        text.parse::<Table>()
            .map_err(|e: toml::de::Error| ConfigError::ParseFile {
                path: path.clone(),
                message: one_line(&text, &e),
            })?;
        figment = figment.merge(Toml::file_exact(path));
    }
    figment = figment.merge(Layer::environment(&defaults, &env)?);
    figment = figment.merge(Layer::flags(&defaults, overrides)?);

    // The listener addresses first, with a hint serde's "invalid socket address syntax"
    // lacks.
    for key in ["http", "admin"] {
        if let Ok(figment::value::Value::String(_, addr)) = figment.find_value(key) {
            if addr.parse::<SocketAddr>().is_err() {
                return Err(invalid(
                    &figment,
                    Invalid::new(
                        key,
                        format!(
                            "{addr:?} is not an IP:PORT address (e.g. 127.0.0.1:8080, \
                             0.0.0.0:8080 or [::1]:8080; host names are not resolved)"
                        ),
                    ),
                ));
            }
        }
    }
    let config: Config = figment.extract().map_err(|e| from_figment(e, &defaults))?;
    config.validate().map_err(|e| invalid(&figment, e))?;
    Ok(Loaded { config, file })
}

/// A TOML error on one line: "line L, column C: what" (toml's own text spans several lines,
/// with a drawing of the place).
fn one_line(text: &str, e: &toml::de::Error) -> String {
    let what = e.message().trim().replace('\n', "; ");
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            format!("line {line}, column {column}: {what}")
        }
        None => what,
    }
}

/// The defaults as a TOML table: the shape every other layer must fit.
pub(super) fn default_table() -> Table {
    // Serialising plain structs of numbers, strings and paths into TOML cannot fail; the
    // unit test `defaults_round_trip` proves it for the current fields.
    Table::try_from(Config::default()).unwrap_or_default()
}

/// One layer figment merges: the defaults, the environment or the flags (the file is
/// figment's own `Toml` provider). `source` names where a key's value came from.
struct Layer {
    name: &'static str,
    dict: Result<Dict, figment::Error>,
    source: fn(&str) -> String,
}

impl Layer {
    fn new(name: &'static str, table: Table, source: fn(&str) -> String) -> Self {
        // A TOML table of strings, integers, booleans and tables is always a figment dict;
        // were it not, extracting would fail with this error rather than lose the layer.
        let dict = match figment::value::Value::serialize(table) {
            Ok(figment::value::Value::Dict(_, d)) => Ok(d),
            Ok(other) => Err(figment::Error::from(format!(
                "the {name} layer is {}, not a table",
                other.to_actual()
            ))),
            Err(e) => Err(e),
        };
        Self { name, dict, source }
    }

    fn defaults(defaults: &Table) -> Self {
        Self::new("default", defaults.clone(), |_| "default".to_owned())
    }

    /// The `UNIMESH_*` variables, each parsed with the type of its key's default.
    fn environment(defaults: &Table, env: &BTreeMap<String, String>) -> Result<Self, ConfigError> {
        let by_env: BTreeMap<String, String> =
            keys().into_iter().map(|k| (env_name(&k), k)).collect();
        let mut table = Table::new();
        for (name, text) in env {
            match by_env.get(name) {
                Some(key) => {
                    let value =
                        typed(defaults, key, text, &format!("environment variable {name}"))?;
                    insert(&mut table, key, value);
                }
                None if ENV_NOT_CONFIG.contains(&name.as_str())
                    || name.starts_with(ENV_TEST_PREFIX) => {}
                None => {
                    return Err(ConfigError::UnknownEnv {
                        name: name.clone(),
                        hint: did_you_mean(name, by_env.keys().map(String::as_str)),
                    })
                }
            }
        }
        Ok(Self::new("environment", table, |key| {
            format!("environment variable {}", env_name(&setting_of(key)))
        }))
    }

    /// The flags given, each parsed with the type of its key's default.
    fn flags(defaults: &Table, overrides: &Overrides) -> Result<Self, ConfigError> {
        let mut table = Table::new();
        for (key, text) in overrides.given() {
            let value = typed(defaults, key, &text, &format!("flag --{}", flag_of(key)))?;
            insert(&mut table, key, value);
        }
        Ok(Self::new("command line", table, |key| {
            format!("flag --{}", flag_of(key))
        }))
    }
}

impl Provider for Layer {
    fn metadata(&self) -> Metadata {
        let source = self.source;
        Metadata::named(self.name)
            .interpolater(move |_: &Profile, keys: &[&str]| source(&keys.join(".")))
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        Ok(Profile::Default.collect(self.dict.clone()?))
    }
}

/// The configuration key that holds the dotted `key`: itself, or the free-name table it is
/// in (`kafka.properties.linger.ms` is in `kafka.properties`, set by one variable).
fn setting_of(key: &str) -> String {
    keys()
        .into_iter()
        .filter(|k| key == k || key.starts_with(&format!("{k}.")))
        .max_by_key(String::len)
        .unwrap_or_else(|| key.to_owned())
}

/// The flag that sets `key` (only keys of [`FLAGS`] come here).
fn flag_of(key: &str) -> &'static str {
    FLAGS
        .iter()
        .find(|(k, _)| *k == key)
        .map_or("?", |(_, flag)| flag)
}

/// The default value at a dotted key.
fn lookup<'t>(table: &'t Table, key: &str) -> Option<&'t Value> {
    let mut parts = key.split('.');
    let mut cur = table.get(parts.next()?)?;
    for part in parts {
        cur = cur.as_table()?.get(part)?;
    }
    Some(cur)
}

/// Sets the dotted `key` of `table`, creating the tables on the way.
fn insert(table: &mut Table, key: &str, value: Value) {
    let mut parts: Vec<&str> = key.split('.').collect();
    let Some(last) = parts.pop() else { return };
    let mut cur = table;
    for part in parts {
        let slot = cur
            .entry(part.to_owned())
            .or_insert_with(|| Value::Table(Table::new()));
        if !slot.is_table() {
            *slot = Value::Table(Table::new());
        }
        let Value::Table(sub) = slot else { return };
        cur = sub;
    }
    cur.insert(last.to_owned(), value);
}

/// `text` (of an environment variable or flag) parsed with the type of `key`'s default.
fn typed(defaults: &Table, key: &str, text: &str, origin: &str) -> Result<Value, ConfigError> {
    let wrong = |expected: &'static str| ConfigError::WrongType {
        origin: origin.to_owned(),
        key: key.to_owned(),
        expected: expected.to_owned(),
        found: format!("{text:?}"),
    };
    Ok(match lookup(defaults, key) {
        Some(Value::Integer(_)) => {
            let n: u64 = text
                .trim()
                .parse()
                .map_err(|_| wrong("a non-negative integer"))?;
            Value::Integer(i64::try_from(n).map_err(|_| wrong("an integer below 2^63"))?)
        }
        Some(Value::Float(_)) => Value::Float(text.trim().parse().map_err(|_| wrong("a number"))?),
        Some(Value::Boolean(_)) => match text.trim() {
            "true" | "1" => Value::Boolean(true),
            "false" | "0" => Value::Boolean(false),
            _ => return Err(wrong("true or false")),
        },
        Some(Value::Table(_)) if key == auth::IDENTITIES_KEY => {
            return Err(wrong(
                "nothing: identities are set in the file ([auth.identities.NAME])",
            ))
        }
        Some(Value::Table(_)) if key == DEDUP_TOPICS_KEY => {
            return Err(wrong(
                "nothing: per-topic windows are set in the file ([dedup.topics.NAME])",
            ))
        }
        // Merged by figment over the file's table, property by property.
        Some(Value::Table(_)) if is_property_table(key) => {
            Value::Table(parse_properties(text).map_err(|_| wrong("NAME=VALUE,NAME=VALUE"))?)
        }
        _ => Value::String(text.to_owned()),
    })
}

/// `k=v,k=v` as a table of strings (the environment form of `kafka.properties`).
fn parse_properties(text: &str) -> Result<Table, String> {
    let mut out = Table::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((k, v)) = pair.split_once('=') else {
            return Err(format!("{pair:?} is not NAME=VALUE"));
        };
        out.insert(k.trim().to_owned(), Value::String(v.trim().to_owned()));
    }
    Ok(out)
}

/// Where the value at the dotted `key` came from. In a free-name table a name may hold dots
/// (`kafka.properties.enable.auto.commit`): the longest table that exists is found and the
/// rest of the key is one name in it.
fn origin(figment: &Figment, key: &str) -> String {
    if let Some(m) = figment.find_metadata(key) {
        return describe(m, key);
    }
    let mut head = key;
    while let Some((h, _)) = head.rsplit_once('.') {
        head = h;
        if let Ok(figment::value::Value::Dict(tag, dict)) = figment.find_value(head) {
            let name = &key[head.len() + 1..];
            let tag = dict.get(name).map_or(tag, |v| v.tag());
            return match figment.get_metadata(tag) {
                Some(m) => describe(m, key),
                None => "default".to_owned(),
            };
        }
    }
    "default".to_owned()
}

/// "config file PATH", "environment variable NAME", "flag --NAME" or "default".
fn describe(m: &Metadata, key: &str) -> String {
    match m.source.as_ref().and_then(|s| s.file_path()) {
        Some(path) => format!("config file {}", path.display()),
        None => {
            let keys: Vec<&str> = key.split('.').collect();
            m.interpolate(&Profile::Default, &keys)
        }
    }
}

/// A section's refusal, with where the refused value came from.
fn invalid(figment: &Figment, e: Invalid) -> ConfigError {
    ConfigError::Invalid {
        origin: origin(figment, &e.key),
        key: e.key,
        why: e.why,
    }
}

/// serde's refusal (through figment, which knows the key and the layer) as one line naming
/// both.
fn from_figment(e: figment::Error, defaults: &Table) -> ConfigError {
    let key = e.path.join(".");
    let origin = match &e.metadata {
        Some(m) => describe(m, &key),
        None => "default".to_owned(),
    };
    match e.kind {
        Kind::UnknownField(name, known) => {
            let section = key.rsplit_once('.').map(|(s, _)| s);
            let mut hint = did_you_mean(&name, known.iter().copied());
            hint.push_str(&format!(
                " (known keys{}: {})",
                section.map(|s| format!(" in [{s}]")).unwrap_or_default(),
                known.join(", ")
            ));
            ConfigError::UnknownKey { key, origin, hint }
        }
        Kind::InvalidType(actual, expected) => ConfigError::WrongType {
            expected: expected_of(defaults, &key, &expected),
            found: found(&actual),
            origin,
            key,
        },
        Kind::InvalidValue(Actual::Signed(n), expected) if n < 0 => ConfigError::WrongType {
            expected: expected_of(defaults, &key, &expected),
            found: found(&Actual::Signed(n)),
            origin,
            key,
        },
        Kind::InvalidValue(actual, expected) => ConfigError::Invalid {
            why: match (number(&actual).as_str(), largest(&expected)) {
                ("0", _) if expected.contains("nonzero") => "is 0: must be at least 1".to_owned(),
                (n, Some(max)) => format!("is {n}: must be at most {max}"),
                (n, None) => format!("is {n}: must be {expected}"),
            },
            key,
            origin,
        },
        Kind::UnknownVariant(found, known) => ConfigError::Invalid {
            key,
            origin,
            why: format!("is {found:?}: must be one of {}", known.join(", ")),
        },
        other => ConfigError::Invalid {
            key,
            origin,
            why: other.to_string(),
        },
    }
}

/// What a key's value must be, in words: from its default's type, else serde's words.
fn expected_of(defaults: &Table, key: &str, serde_says: &str) -> String {
    match lookup(defaults, key) {
        Some(Value::String(_)) => "a string".to_owned(),
        Some(Value::Integer(_)) => "a non-negative integer".to_owned(),
        Some(Value::Boolean(_)) => "a boolean (true or false)".to_owned(),
        Some(Value::Table(_)) => "a table".to_owned(),
        _ => serde_says.to_owned(),
    }
}

/// A refused value in words.
fn found(actual: &Actual) -> String {
    match actual {
        Actual::Signed(n) if *n < 0 => format!("the negative number {n}"),
        Actual::Signed(n) => format!("the integer {n}"),
        Actual::Unsigned(n) => format!("the integer {n}"),
        Actual::Str(s) => format!("the string {s:?}"),
        Actual::Bool(b) => format!("the boolean {b}"),
        Actual::Seq => "an array".to_owned(),
        Actual::Map => "a table".to_owned(),
        other => other.to_string(),
    }
}

/// The largest value of the integer type serde names as expected (`u32`, `a nonzero u64`).
fn largest(expected: &str) -> Option<u64> {
    Some(match expected.rsplit(' ').next()? {
        "u8" => u8::MAX.into(),
        "u16" => u16::MAX.into(),
        "u32" => u32::MAX.into(),
        "u64" | "usize" => u64::MAX,
        _ => return None,
    })
}

fn number(actual: &Actual) -> String {
    match actual {
        Actual::Signed(n) => n.to_string(),
        Actual::Unsigned(n) => n.to_string(),
        other => other.to_string(),
    }
}

/// " (did you mean X?)" when one of `known` is close to `name`, else nothing.
fn did_you_mean<'k>(name: &str, known: impl Iterator<Item = &'k str>) -> String {
    known
        .map(|k| (strsim::jaro_winkler(name, k), k))
        .filter(|(score, _)| *score > 0.85)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, k)| format!(" (did you mean {k}?)"))
        .unwrap_or_default()
}

/// Every leaf key of the defaults as a dotted path.
fn leaf_keys(table: &Table, prefix: &str, out: &mut Vec<String>) {
    for (key, value) in table {
        let full = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        match value {
            Value::Table(_)
                if is_property_table(&full)
                    || full == auth::IDENTITIES_KEY
                    || full == DEDUP_TOPICS_KEY =>
            {
                out.push(full)
            }
            Value::Table(sub) => leaf_keys(sub, &full, out),
            _ => out.push(full),
        }
    }
}

/// The environment variable of a dotted key: `limits.max_wait_ms` → `UNIMESH_LIMITS_MAX_WAIT_MS`.
pub fn env_name(key: &str) -> String {
    format!("{ENV_PREFIX}{}", key.replace('.', "_").to_ascii_uppercase())
}

/// Every configuration key, dotted, in file order (for documentation and tests).
pub fn keys() -> Vec<String> {
    let mut out = Vec::new();
    leaf_keys(&default_table(), "", &mut out);
    out
}
