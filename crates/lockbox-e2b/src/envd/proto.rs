//! envd's messages (`spec/envd/process/process.proto` and
//! `spec/envd/filesystem/filesystem.proto` of e2b-dev/E2B), written by hand: `prost`
//! derives give the binary codec, `serde` derives the proto3 JSON mapping (lowerCamelCase
//! names, snake_case accepted on input, `bytes` as base64, `int64` as strings, enums by
//! name, `Timestamp` as RFC 3339, a oneof as its one set field, unset optionals left out).
//! Nested messages are flattened into `Outer` + `Inner` names; the wire does not carry names.
#![allow(missing_docs)]

use serde::{Deserialize, Serialize};
use std::collections::HashMap;

// ---------------------------------------------------------------- process.Process

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct PtySizeMsg {
    #[prost(uint32, tag = "1")]
    pub cols: u32,
    #[prost(uint32, tag = "2")]
    pub rows: u32,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct Pty {
    #[prost(message, optional, tag = "1")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<PtySizeMsg>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct ProcessConfig {
    #[prost(string, tag = "1")]
    pub cmd: String,
    #[prost(string, repeated, tag = "2")]
    pub args: Vec<String>,
    #[prost(map = "string, string", tag = "3")]
    pub envs: HashMap<String, String>,
    #[prost(string, optional, tag = "4")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct ListRequest {}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct ProcessInfo {
    #[prost(message, optional, tag = "1")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config: Option<ProcessConfig>,
    #[prost(uint32, tag = "2")]
    pub pid: u32,
    #[prost(string, optional, tag = "3")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct ListResponse {
    #[prost(message, repeated, tag = "1")]
    pub processes: Vec<ProcessInfo>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct StartRequest {
    #[prost(message, optional, tag = "1")]
    pub process: Option<ProcessConfig>,
    #[prost(message, optional, tag = "2")]
    pub pty: Option<Pty>,
    #[prost(string, optional, tag = "3")]
    pub tag: Option<String>,
    #[prost(bool, optional, tag = "4")]
    pub stdin: Option<bool>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct UpdateRequest {
    #[prost(message, optional, tag = "1")]
    pub process: Option<ProcessSelector>,
    #[prost(message, optional, tag = "2")]
    pub pty: Option<Pty>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct UpdateResponse {}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct ProcessEvent {
    #[prost(oneof = "Event", tags = "1, 2, 3, 4")]
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub event: Option<Event>,
}

/// `ProcessEvent.event`.
#[derive(Clone, PartialEq, prost::Oneof, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Event {
    #[prost(message, tag = "1")]
    Start(StartEvent),
    #[prost(message, tag = "2")]
    Data(DataEvent),
    #[prost(message, tag = "3")]
    End(EndEvent),
    #[prost(message, tag = "4")]
    Keepalive(KeepAlive),
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct StartEvent {
    #[prost(uint32, tag = "1")]
    pub pid: u32,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct DataEvent {
    #[prost(oneof = "Output", tags = "1, 2, 3")]
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub output: Option<Output>,
}

/// `ProcessEvent.DataEvent.output`.
#[derive(Clone, PartialEq, prost::Oneof, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Output {
    #[prost(bytes, tag = "1")]
    #[serde(with = "b64")]
    Stdout(Vec<u8>),
    #[prost(bytes, tag = "2")]
    #[serde(with = "b64")]
    Stderr(Vec<u8>),
    #[prost(bytes, tag = "3")]
    #[serde(with = "b64")]
    Pty(Vec<u8>),
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct EndEvent {
    #[prost(sint32, tag = "1")]
    #[serde(alias = "exit_code")]
    pub exit_code: i32,
    #[prost(bool, tag = "2")]
    pub exited: bool,
    #[prost(string, tag = "3")]
    pub status: String,
    #[prost(string, optional, tag = "4")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct KeepAlive {}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct StartResponse {
    #[prost(message, optional, tag = "1")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event: Option<ProcessEvent>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct ConnectResponse {
    #[prost(message, optional, tag = "1")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event: Option<ProcessEvent>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct ConnectRequest {
    #[prost(message, optional, tag = "1")]
    pub process: Option<ProcessSelector>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct SendInputRequest {
    #[prost(message, optional, tag = "1")]
    pub process: Option<ProcessSelector>,
    #[prost(message, optional, tag = "2")]
    pub input: Option<ProcessInput>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct SendInputResponse {}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct ProcessInput {
    #[prost(oneof = "Input", tags = "1, 2")]
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub input: Option<Input>,
}

/// `ProcessInput.input`.
#[derive(Clone, PartialEq, prost::Oneof, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Input {
    #[prost(bytes, tag = "1")]
    #[serde(with = "b64")]
    Stdin(Vec<u8>),
    #[prost(bytes, tag = "2")]
    #[serde(with = "b64")]
    Pty(Vec<u8>),
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct StreamInputRequest {
    #[prost(oneof = "StreamInputEvent", tags = "1, 2, 3")]
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub event: Option<StreamInputEvent>,
}

/// `StreamInputRequest.event`.
#[derive(Clone, PartialEq, prost::Oneof, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StreamInputEvent {
    #[prost(message, tag = "1")]
    Start(StreamInputStart),
    #[prost(message, tag = "2")]
    Data(StreamInputData),
    #[prost(message, tag = "3")]
    Keepalive(KeepAlive),
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct StreamInputStart {
    #[prost(message, optional, tag = "1")]
    pub process: Option<ProcessSelector>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct StreamInputData {
    #[prost(message, optional, tag = "2")]
    pub input: Option<ProcessInput>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct StreamInputResponse {}

/// `process.Signal`'s values.
pub const SIGNAL_SIGTERM: i32 = 15;
/// `process.Signal`'s values.
pub const SIGNAL_SIGKILL: i32 = 9;

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct SendSignalRequest {
    #[prost(message, optional, tag = "1")]
    pub process: Option<ProcessSelector>,
    #[prost(int32, tag = "2")]
    #[serde(with = "signal")]
    pub signal: i32,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct SendSignalResponse {}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct CloseStdinRequest {
    #[prost(message, optional, tag = "1")]
    pub process: Option<ProcessSelector>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct CloseStdinResponse {}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct ProcessSelector {
    #[prost(oneof = "Selector", tags = "1, 2")]
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub selector: Option<Selector>,
}

/// `ProcessSelector.selector`.
#[derive(Clone, PartialEq, prost::Oneof, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Selector {
    #[prost(uint32, tag = "1")]
    Pid(u32),
    #[prost(string, tag = "2")]
    Tag(String),
}

// ------------------------------------------------------------ filesystem.Filesystem

/// `filesystem.FileType`'s values.
pub const FILE_TYPE_FILE: i32 = 1;
/// `filesystem.FileType`'s values.
pub const FILE_TYPE_DIRECTORY: i32 = 2;
/// `filesystem.FileType`'s values.
pub const FILE_TYPE_SYMLINK: i32 = 3;

/// `filesystem.EventType`'s values.
pub const EVENT_TYPE_CREATE: i32 = 1;
/// `filesystem.EventType`'s values.
pub const EVENT_TYPE_WRITE: i32 = 2;
/// `filesystem.EventType`'s values.
pub const EVENT_TYPE_REMOVE: i32 = 3;
/// `filesystem.EventType`'s values.
pub const EVENT_TYPE_RENAME: i32 = 4;
/// `filesystem.EventType`'s values.
pub const EVENT_TYPE_CHMOD: i32 = 5;

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct MoveRequest {
    #[prost(string, tag = "1")]
    pub source: String,
    #[prost(string, tag = "2")]
    pub destination: String,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct EntryResponse {
    #[prost(message, optional, tag = "1")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entry: Option<EntryInfo>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct PathRequest {
    #[prost(string, tag = "1")]
    pub path: String,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct RemoveResponse {}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct EntryInfo {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(int32, tag = "2")]
    #[serde(with = "file_type")]
    pub r#type: i32,
    #[prost(string, tag = "3")]
    pub path: String,
    #[prost(int64, tag = "4")]
    #[serde(with = "int64")]
    pub size: i64,
    #[prost(uint32, tag = "5")]
    pub mode: u32,
    #[prost(string, tag = "6")]
    pub permissions: String,
    #[prost(string, tag = "7")]
    pub owner: String,
    #[prost(string, tag = "8")]
    pub group: String,
    #[prost(message, optional, tag = "9")]
    #[serde(
        alias = "modified_time",
        skip_serializing_if = "Option::is_none",
        with = "timestamp"
    )]
    pub modified_time: Option<Timestamp>,
    #[prost(string, optional, tag = "10")]
    #[serde(alias = "symlink_target", skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
    #[prost(map = "string, string", tag = "11")]
    pub metadata: HashMap<String, String>,
    #[prost(bool, tag = "12")]
    #[serde(alias = "is_symlink")]
    pub is_symlink: bool,
}

/// `google.protobuf.Timestamp`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Timestamp {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct ListDirRequest {
    #[prost(string, tag = "1")]
    pub path: String,
    #[prost(uint32, tag = "2")]
    pub depth: u32,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct ListDirResponse {
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<EntryInfo>,
}

/// `WatchDirRequest` and `CreateWatcherRequest` (the same fields).
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct WatchRequest {
    #[prost(string, tag = "1")]
    pub path: String,
    #[prost(bool, tag = "2")]
    pub recursive: bool,
    #[prost(bool, tag = "3")]
    #[serde(alias = "include_entry")]
    pub include_entry: bool,
    #[prost(bool, tag = "4")]
    #[serde(alias = "allow_network_mounts")]
    pub allow_network_mounts: bool,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct FilesystemEvent {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(int32, tag = "2")]
    #[serde(with = "event_type")]
    pub r#type: i32,
    #[prost(message, optional, tag = "3")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entry: Option<EntryInfo>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct WatchDirResponse {
    #[prost(oneof = "WatchEvent", tags = "1, 2, 3")]
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub event: Option<WatchEvent>,
}

/// `WatchDirResponse.event`.
// One event per message on the wire: the size difference costs nothing worth boxing for.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, PartialEq, prost::Oneof, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum WatchEvent {
    #[prost(message, tag = "1")]
    Start(KeepAlive),
    #[prost(message, tag = "2")]
    Filesystem(FilesystemEvent),
    #[prost(message, tag = "3")]
    Keepalive(KeepAlive),
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct WatcherId {
    #[prost(string, tag = "1")]
    #[serde(alias = "watcher_id")]
    pub watcher_id: String,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct GetWatcherEventsResponse {
    #[prost(message, repeated, tag = "1")]
    pub events: Vec<FilesystemEvent>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct RemoveWatcherResponse {}

// ------------------------------------------------------------------ JSON helpers

/// `bytes` as base64 (standard alphabet on output; standard or URL-safe, padded or not,
/// on input).
mod b64 {
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        let text = text.trim_end_matches('=');
        let normal: String = text
            .chars()
            .map(|c| match c {
                '-' => '+',
                '_' => '/',
                c => c,
            })
            .collect();
        base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(normal)
            .map_err(serde::de::Error::custom)
    }
}

/// `int64` as a decimal string (a number accepted on input).
mod int64 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &i64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&v.to_string())
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        N(i64),
        S(String),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
        match Either::deserialize(d)? {
            Either::N(n) => Ok(n),
            Either::S(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// An enum field by name (its number accepted on input).
macro_rules! enum_names {
    ($module:ident, $($number:literal => $name:literal),+ $(,)?) => {
        mod $module {
            use serde::{Deserialize, Deserializer, Serializer};

            pub fn serialize<S: Serializer>(v: &i32, s: S) -> Result<S::Ok, S::Error> {
                match *v {
                    $($number => s.serialize_str($name),)+
                    other => s.serialize_i32(other),
                }
            }

            #[derive(Deserialize)]
            #[serde(untagged)]
            enum Either {
                N(i32),
                S(String),
            }

            pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
                match Either::deserialize(d)? {
                    Either::N(n) => Ok(n),
                    Either::S(s) => match s.as_str() {
                        $($name => Ok($number),)+
                        other => Err(serde::de::Error::custom(format!(
                            "unknown {} value {other:?}", stringify!($module)
                        ))),
                    },
                }
            }
        }
    };
}

enum_names!(signal, 0 => "SIGNAL_UNSPECIFIED", 15 => "SIGNAL_SIGTERM", 9 => "SIGNAL_SIGKILL");
enum_names!(file_type, 0 => "FILE_TYPE_UNSPECIFIED", 1 => "FILE_TYPE_FILE",
    2 => "FILE_TYPE_DIRECTORY", 3 => "FILE_TYPE_SYMLINK");
enum_names!(event_type, 0 => "EVENT_TYPE_UNSPECIFIED", 1 => "EVENT_TYPE_CREATE",
    2 => "EVENT_TYPE_WRITE", 3 => "EVENT_TYPE_REMOVE", 4 => "EVENT_TYPE_RENAME",
    5 => "EVENT_TYPE_CHMOD");

/// `google.protobuf.Timestamp` as RFC 3339 in UTC (`1970-01-01T00:00:00.5Z`).
mod timestamp {
    use super::Timestamp;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Timestamp>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(t) => s.serialize_str(&format(t)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Timestamp>, D::Error> {
        let text = Option::<String>::deserialize(d)?;
        text.map(|t| parse(&t).ok_or_else(|| serde::de::Error::custom("bad timestamp")))
            .transpose()
    }

    pub(super) fn format(t: &Timestamp) -> String {
        let days = t.seconds.div_euclid(86_400);
        let secs = t.seconds.rem_euclid(86_400);
        let (y, m, d) = civil_from_days(days);
        let mut out = format!(
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}",
            secs / 3600,
            secs / 60 % 60,
            secs % 60
        );
        if t.nanos > 0 {
            let frac = format!("{:09}", t.nanos);
            out.push('.');
            out.push_str(frac.trim_end_matches('0'));
        }
        out.push('Z');
        out
    }

    fn parse(text: &str) -> Option<Timestamp> {
        let text = text.strip_suffix('Z')?;
        let (date, time) = text.split_once('T')?;
        let mut ymd = date.split('-').map(|p| p.parse::<i64>());
        let (y, m, d) = (ymd.next()?.ok()?, ymd.next()?.ok()?, ymd.next()?.ok()?);
        let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
        let mut parts = hms.split(':').map(|p| p.parse::<i64>());
        let (h, mi, s) = (
            parts.next()?.ok()?,
            parts.next()?.ok()?,
            parts.next()?.ok()?,
        );
        let nanos = if frac.is_empty() {
            0
        } else {
            format!("{frac:0<9}").get(..9)?.parse().ok()?
        };
        Some(Timestamp {
            seconds: days_from_civil(y, m, d) * 86_400 + h * 3600 + mi * 60 + s,
            nanos,
        })
    }

    // Howard Hinnant's date algorithms (public domain).
    fn civil_from_days(z: i64) -> (i64, i64, i64) {
        let z = z + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let y = yoe + era * 400;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let d = doy - (153 * mp + 2) / 5 + 1;
        let m = if mp < 10 { mp + 3 } else { mp - 9 };
        (if m <= 2 { y + 1 } else { y }, m, d)
    }

    fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
        let y = if m <= 2 { y - 1 } else { y };
        let era = y.div_euclid(400);
        let yoe = y.rem_euclid(400);
        let mp = if m > 2 { m - 3 } else { m + 9 };
        let doy = (153 * mp + 2) / 5 + d - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        era * 146_097 + doe - 719_468
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn process_events_map_to_proto3_json_as_the_sdk_reads_them() {
        let data = StartResponse {
            event: Some(ProcessEvent {
                event: Some(Event::Data(DataEvent {
                    output: Some(Output::Stdout(b"hi\n".to_vec())),
                })),
            }),
        };
        assert_eq!(
            serde_json::to_string(&data).unwrap(),
            r#"{"event":{"data":{"stdout":"aGkK"}}}"#
        );
        let end = ProcessEvent {
            event: Some(Event::End(EndEvent {
                exit_code: -1,
                exited: false,
                status: "signal: killed".into(),
                error: None,
            })),
        };
        assert_eq!(
            serde_json::to_string(&end).unwrap(),
            r#"{"end":{"exitCode":-1,"exited":false,"status":"signal: killed"}}"#
        );
        let back: ProcessEvent =
            serde_json::from_str(r#"{"end":{"exit_code":3,"status":"x"}}"#).unwrap();
        assert!(matches!(
            back.event,
            Some(Event::End(EndEvent { exit_code: 3, .. }))
        ));
    }

    #[test]
    fn requests_parse_from_the_sdks_json_and_from_binary() {
        let json = r#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],"envs":{"A":"1"}},"stdin":false,"unknownField":1}"#;
        let req: StartRequest = serde_json::from_str(json).unwrap();
        let config = req.process.clone().unwrap();
        assert_eq!(config.args, ["-l", "-c", "echo hi"]);
        assert_eq!(config.envs.get("A").map(String::as_str), Some("1"));
        assert_eq!(req.stdin, Some(false));
        let again = StartRequest::decode(req.encode_to_vec().as_slice()).unwrap();
        assert_eq!(again, req);
        let sig: SendSignalRequest =
            serde_json::from_str(r#"{"process":{"pid":7},"signal":"SIGNAL_SIGKILL"}"#).unwrap();
        assert_eq!(sig.signal, SIGNAL_SIGKILL);
        assert_eq!(
            sig.process.unwrap().selector,
            Some(Selector::Pid(7)),
            "a oneof is its one field"
        );
        let input: SendInputRequest =
            serde_json::from_str(r#"{"process":{"tag":"t"},"input":{"stdin":"aGk="}}"#).unwrap();
        assert_eq!(
            input.input.unwrap().input,
            Some(Input::Stdin(b"hi".to_vec()))
        );
    }

    #[test]
    fn entry_info_uses_strings_for_int64_enums_and_timestamps() {
        let e = EntryInfo {
            name: "a".into(),
            r#type: FILE_TYPE_FILE,
            size: 5,
            modified_time: Some(Timestamp {
                seconds: 1_700_000_000,
                nanos: 500_000_000,
            }),
            ..EntryInfo::default()
        };
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["type"], "FILE_TYPE_FILE");
        assert_eq!(v["size"], "5");
        assert_eq!(v["modifiedTime"], "2023-11-14T22:13:20.5Z");
        let back: EntryInfo = serde_json::from_value(v).unwrap();
        assert_eq!(back, e);
    }
}
