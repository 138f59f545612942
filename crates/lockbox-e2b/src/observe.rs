//! An E2B sandbox's logs and metrics, from what lockbox knows of it.
//!
//! - **Logs** (`GET /sandboxes/{id}/logs`, `/v2/sandboxes/{id}/logs`): E2B's are envd's own
//!   log lines; lockbox has none of those, so a sandbox's log is what happened to it
//!   (created, paused, resumed, forked, snapshots: level `info`) and its network
//!   supervisor's decisions (`--net-allow`/`--net-deny` policies: allowed `info`, denied
//!   `warn`; lockbox keeps the last ones of the running instance).
//! - **Metrics** (`GET /sandboxes/{id}/metrics`, `/sandboxes/metrics`): one sample, now:
//!   the sandbox's processes' resident memory, their CPU time over the instance's life as
//!   a percentage of the host's CPUs, and its memory limit (else the host's memory) as
//!   the total. Disk figures are 0 (lockbox does not bound a sandbox's disk). E2B samples
//!   every few seconds and answers the series; lockbox keeps no history.

use crate::control::{bad, known, not_found, time};
use crate::{E2b, E2bError};
use axum::extract::{Path, Query, State};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The most log entries one answer holds (E2B's `limit` maximum and default).
pub const MAX_LOGS: usize = 1000;

/// One entry of a sandbox's log.
#[derive(Debug, Clone)]
struct Entry {
    at: SystemTime,
    level: &'static str,
    message: String,
    fields: Map<String, Value>,
}

impl Entry {
    fn json(&self) -> Value {
        json!({
            "timestamp": time(self.at),
            "level": self.level,
            "message": self.message,
            "fields": self.fields,
        })
    }
}

fn millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The log of E2B sandbox `id`, oldest first.
fn entries(e2b: &E2b, id: &str) -> Result<Vec<Entry>, E2bError> {
    let sandbox = known(e2b, id)?;
    let mut all: Vec<Entry> = sandbox
        .events
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .map(|(at, message)| Entry {
            at: *at,
            level: "info",
            message: message.clone(),
            fields: Map::from_iter([("logger".to_owned(), json!("lockbox"))]),
        })
        .collect();
    if sandbox.paused.is_none() {
        if let Ok(handle) = e2b.runtime.sandbox(sandbox.instance_id(id)) {
            for event in handle.audit_log() {
                let Some(at) = lockbox_policy::time::parse(&event.ts) else {
                    continue;
                };
                let Ok(Value::Object(mut fields)) = serde_json::to_value(&event) else {
                    continue;
                };
                fields.remove("ts");
                let text = |key: &str| {
                    fields
                        .get(key)
                        .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
                };
                let kind = text("kind").unwrap_or_default();
                let decision = text("decision").unwrap_or_default();
                let target = match (text("name"), text("address"), text("port")) {
                    (Some(name), _, Some(port)) => format!(" {name}:{port}"),
                    (Some(name), _, None) => format!(" {name}"),
                    (None, Some(addr), Some(port)) => format!(" {addr}:{port}"),
                    (None, Some(addr), None) => format!(" {addr}"),
                    _ => String::new(),
                };
                let reason = text("reason").map_or_else(String::new, |r| format!(" ({r})"));
                let fields = fields
                    .into_iter()
                    .map(|(k, v)| {
                        let v = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
                        (k, Value::String(v))
                    })
                    .chain([("logger".to_owned(), json!("network"))])
                    .collect();
                all.push(Entry {
                    at,
                    level: if decision == "denied" { "warn" } else { "info" },
                    message: format!("network: {kind}{target} {decision}{reason}"),
                    fields,
                });
            }
        }
    }
    all.sort_by_key(|e| e.at);
    Ok(all)
}

/// A `limit` query parameter: 0 to [`MAX_LOGS`], [`MAX_LOGS`] when not given.
fn limit_of(limit: Option<&str>) -> Result<usize, E2bError> {
    match limit.filter(|l| !l.is_empty()) {
        None => Ok(MAX_LOGS),
        Some(text) => text
            .parse::<usize>()
            .ok()
            .filter(|n| *n <= MAX_LOGS)
            .ok_or_else(|| {
                bad(format!(
                    "limit: a number from 0 to {MAX_LOGS}, got {text:?}"
                ))
            }),
    }
}

/// A millisecond timestamp query parameter named `field`.
fn millis_of(field: &str, text: Option<&str>) -> Result<Option<u64>, E2bError> {
    text.filter(|t| !t.is_empty())
        .map(|t| {
            t.parse::<u64>()
                .map_err(|_| bad(format!("{field}: milliseconds since 1970, got {t:?}")))
        })
        .transpose()
}

/// `GET /sandboxes/{id}/logs` query.
#[derive(Debug, Deserialize)]
pub(crate) struct LogsV1Query {
    start: Option<String>,
    limit: Option<String>,
}

/// `GET /sandboxes/{id}/logs` (deprecated by E2B): `{logs: [{timestamp, line}],
/// logEntries: [...]}` from `start` (milliseconds) on, oldest first.
pub(crate) async fn logs_v1(
    State(e2b): State<E2b>,
    Path(id): Path<String>,
    Query(query): Query<LogsV1Query>,
) -> Result<Json<Value>, E2bError> {
    let start = millis_of("start", query.start.as_deref())?;
    let limit = limit_of(query.limit.as_deref())?;
    let page: Vec<Entry> = entries(&e2b, &id)?
        .into_iter()
        .filter(|e| start.is_none_or(|s| millis(e.at) >= s))
        .take(limit)
        .collect();
    Ok(Json(json!({
        "logs": page
            .iter()
            .map(|e| json!({"timestamp": time(e.at), "line": e.message}))
            .collect::<Vec<_>>(),
        "logEntries": page.iter().map(Entry::json).collect::<Vec<_>>(),
    })))
}

/// `GET /v2/sandboxes/{id}/logs` query.
#[derive(Debug, Deserialize)]
pub(crate) struct LogsV2Query {
    cursor: Option<String>,
    limit: Option<String>,
    direction: Option<String>,
    level: Option<String>,
    search: Option<String>,
}

/// The rank of a log level (`debug` < `info` < `warn` < `error`).
fn rank(level: &str) -> Option<u8> {
    ["debug", "info", "warn", "error"]
        .iter()
        .position(|l| *l == level)
        .and_then(|p| u8::try_from(p).ok())
}

/// `GET /v2/sandboxes/{id}/logs`: `{logs: [SandboxLogEntry]}` from `cursor` (milliseconds)
/// on (`direction=forward`, the default) or back (`backward`, newest first), at least
/// `level`, whose message contains `search`.
pub(crate) async fn logs_v2(
    State(e2b): State<E2b>,
    Path(id): Path<String>,
    Query(query): Query<LogsV2Query>,
) -> Result<Json<Value>, E2bError> {
    let cursor = millis_of("cursor", query.cursor.as_deref())?;
    let limit = limit_of(query.limit.as_deref())?;
    let backward = match query.direction.as_deref() {
        None | Some("") | Some("forward") => false,
        Some("backward") => true,
        Some(other) => {
            return Err(bad(format!(
                "direction: \"forward\" or \"backward\", got {other:?}"
            )))
        }
    };
    let least = match query.level.as_deref().filter(|l| !l.is_empty()) {
        None => 0,
        Some(l) => rank(l)
            .ok_or_else(|| bad(format!("level: one of debug, info, warn, error, got {l:?}")))?,
    };
    if query.search.as_ref().is_some_and(|s| s.len() > 256) {
        return Err(bad("search: at most 256 bytes"));
    }
    let search = query.search.as_deref().unwrap_or("");
    let mut all = entries(&e2b, &id)?;
    if backward {
        all.reverse();
    }
    let page: Vec<Value> = all
        .iter()
        .filter(|e| {
            cursor.is_none_or(|c| {
                if backward {
                    millis(e.at) <= c
                } else {
                    millis(e.at) >= c
                }
            })
        })
        .filter(|e| rank(e.level).unwrap_or(0) >= least)
        .filter(|e| e.message.contains(search))
        .take(limit)
        .map(Entry::json)
        .collect();
    Ok(Json(json!({ "logs": page })))
}

/// The host's memory (`MemTotal` of `/proc/meminfo`), in bytes; 0 if unreadable.
fn host_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// E2B's `SandboxMetric` of the running E2B sandbox `id`, now; `None` if it is paused.
fn sample(e2b: &E2b, id: &str) -> Result<Option<Value>, E2bError> {
    let sandbox = known(e2b, id)?;
    if sandbox.paused.is_some() {
        return Ok(None);
    }
    let info = e2b
        .runtime
        .sandbox_info(sandbox.instance_id(id))
        .map_err(|_| not_found(id))?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (rss, cpu) = info
        .usage
        .map_or((0, Duration::ZERO), |u| (u.rss_bytes, u.cpu));
    let now = SystemTime::now();
    let life = now
        .duration_since(info.created_at)
        .unwrap_or(Duration::ZERO)
        .as_secs_f64();
    let cpu_pct = if life > 0.0 {
        (cpu.as_secs_f64() / life / cpus as f64 * 100.0).min(100.0)
    } else {
        0.0
    };
    let mem_total = info
        .policy
        .and_then(|p| p.max_memory_bytes)
        .unwrap_or_else(host_memory);
    Ok(Some(json!({
        "timestamp": time(now),
        "timestampUnix": now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        "cpuCount": cpus,
        "cpuUsedPct": cpu_pct,
        "memUsed": rss,
        "memTotal": mem_total,
        "memCache": 0,
        "diskUsed": 0,
        "diskTotal": 0,
    })))
}

/// `GET /sandboxes/{id}/metrics` query (seconds since 1970).
#[derive(Debug, Deserialize)]
pub(crate) struct MetricsQuery {
    start: Option<String>,
    end: Option<String>,
}

/// `GET /sandboxes/{id}/metrics`: one sample, now, if it falls between `start` and `end`
/// (none for a paused sandbox).
pub(crate) async fn metrics(
    State(e2b): State<E2b>,
    Path(id): Path<String>,
    Query(query): Query<MetricsQuery>,
) -> Result<Json<Value>, E2bError> {
    let seconds = |field: &str, text: Option<&str>| {
        text.filter(|t| !t.is_empty())
            .map(|t| {
                t.parse::<u64>()
                    .map_err(|_| bad(format!("{field}: seconds since 1970, got {t:?}")))
            })
            .transpose()
    };
    let start = seconds("start", query.start.as_deref())?;
    let end = seconds("end", query.end.as_deref())?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let within = start.is_none_or(|s| s <= now) && end.is_none_or(|e| now <= e);
    let samples: Vec<Value> = match sample(&e2b, &id)? {
        Some(s) if within => vec![s],
        _ => Vec::new(),
    };
    Ok(Json(Value::Array(samples)))
}

/// `GET /sandboxes/metrics` query.
#[derive(Debug, Deserialize)]
pub(crate) struct ManyQuery {
    sandbox_ids: Option<String>,
}

/// `GET /sandboxes/metrics?sandbox_ids=a,b`: `{sandboxes: {id: SandboxMetric}}` for those
/// that run (at most 100 ids; unknown and paused ones are left out).
pub(crate) async fn metrics_of_many(
    State(e2b): State<E2b>,
    Query(query): Query<ManyQuery>,
) -> Result<Json<Value>, E2bError> {
    let Some(ids) = query.sandbox_ids.filter(|s| !s.is_empty()) else {
        return Err(bad("sandbox_ids: required (comma-separated sandbox ids)"));
    };
    let ids: Vec<&str> = ids
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if ids.len() > 100 {
        return Err(bad(format!("sandbox_ids: at most 100, got {}", ids.len())));
    }
    let mut out = Map::new();
    for id in ids {
        if let Ok(Some(s)) = sample(&e2b, id) {
            out.insert(id.to_owned(), s);
        }
    }
    Ok(Json(json!({ "sandboxes": out })))
}
