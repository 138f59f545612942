//! Every JSON reply a serve test reads through [`super::Served::json`] is checked against the
//! OpenAPI document the server publishes (issue 33 item 5: the document must match what the
//! server sends). The operation is found by method and path template; the reply's status
//! must be documented for it (exactly, as a range such as `4XX`, or as `default`); and the
//! body must match the documented schema. Objects of the document are closed for this check
//! (`unevaluatedProperties: false`), so a field the server sends but the document does not
//! name fails as surely as a documented field the server leaves out.

use reqwest::{Method, StatusCode};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// Panics, naming the operation and each mismatch, unless `body` is what the document says
/// `method path` answers with `status`.
pub fn check(method: &Method, path: &str, status: StatusCode, body: &Value) {
    if let Err(why) = mismatch(method, path, status, body) {
        panic!("{method} {path} answered {status} with a reply the OpenAPI document does not describe: {why}\nreply: {body}");
    }
}

/// Why `body` is not what the document describes, if it is not.
pub fn mismatch(
    method: &Method,
    path: &str,
    status: StatusCode,
    body: &Value,
) -> Result<(), String> {
    let doc = lockbox_server::openapi::document();
    let path = path.split('?').next().unwrap_or(path);
    let Some(template) = template_of(doc, path) else {
        return Err(format!("no documented path matches {path}"));
    };
    let operation = &doc["paths"][template.as_str()][method.as_str().to_ascii_lowercase()];
    if operation.is_null() {
        return Err(format!("{template} documents no {method}"));
    }
    let responses = &operation["responses"];
    let code = status.as_u16().to_string();
    let range = format!("{}XX", status.as_u16() / 100);
    let Some(response) = [code.as_str(), range.as_str(), "default"]
        .iter()
        .map(|k| &responses[*k])
        .find(|r| !r.is_null())
    else {
        return Err(format!(
            "status {status} is not documented for {method} {template}"
        ));
    };
    let Some(schema) = response["content"]["application/json"]["schema"].as_object() else {
        // Documented with another content type (a file, text, a stream): not JSON to match.
        // Documented with none (204): the body must be empty.
        return if response["content"].is_object() || body.is_null() {
            Ok(())
        } else {
            Err(format!(
                "{method} {template} is documented without a body for {status}"
            ))
        };
    };
    let key = format!("{method} {template} {code}");
    let validators = validators();
    let mut cache = validators.lock().unwrap_or_else(|e| e.into_inner());
    let validator = match cache.entry(key) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(e) => {
            let root = closed(schema, doc);
            let v = jsonschema::draft202012::new(&root).map_err(|e| {
                format!("the document's schema for {template} does not compile: {e}")
            })?;
            e.insert(v)
        }
    };
    let errors: Vec<String> = validator
        .iter_errors(body)
        .map(|e| format!("at {:?}: {e}", e.instance_path.to_string()))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

type Validators = Mutex<HashMap<String, jsonschema::Validator>>;

fn validators() -> &'static Validators {
    static CACHE: OnceLock<Validators> = OnceLock::new();
    CACHE.get_or_init(Validators::default)
}

/// The documented path template `path` belongs to: each `{param}` matches one segment, a
/// last `{path}` (a proxied port's rest) matches the rest; the template with the fewest
/// parameters wins (`/v1/sandboxes/{id}/files` before `/v1/sandboxes/{id}/{...}`).
fn template_of(doc: &Value, path: &str) -> Option<String> {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let paths = doc["paths"].as_object()?;
    paths
        .keys()
        .filter_map(|template| {
            let parts: Vec<&str> = template.trim_start_matches('/').split('/').collect();
            let is_param = |p: &str| p.starts_with('{') && p.ends_with('}');
            let rest = parts.last() == Some(&"{path}");
            let fits = if rest {
                segments.len() >= parts.len()
            } else {
                segments.len() == parts.len()
            };
            let same = fits
                && parts
                    .iter()
                    .zip(&segments)
                    .all(|(p, s)| is_param(p) || p == s);
            same.then(|| (parts.iter().filter(|p| is_param(p)).count(), template))
        })
        .min()
        .map(|(_, t)| t.clone())
}

/// Adds `unevaluatedProperties: false` to every object schema with `properties` or `allOf`
/// that says nothing about other properties. The parts of an `allOf` stay open (each sees
/// only its own properties; the schema holding them is closed instead): a `$ref` there is
/// pointed at an open copy of its schema, whose name is added to `open`.
fn close_objects(schema: &mut Value, in_all_of: bool, open: &mut Vec<String>) {
    match schema {
        Value::Object(map) => {
            let said = map.contains_key("additionalProperties")
                || map.contains_key("unevaluatedProperties");
            let object = map.contains_key("properties") || map.contains_key("allOf");
            if object && !said && !in_all_of {
                map.insert("unevaluatedProperties".into(), json!(false));
            }
            if in_all_of {
                if let Some(Value::String(target)) = map.get_mut("$ref") {
                    let name = target.rsplit('/').next().unwrap_or_default().to_owned();
                    *target = format!("#/components/schemas/{name}{OPEN}");
                    open.push(name);
                }
            }
            for (k, v) in map.iter_mut() {
                match (k.as_str(), v) {
                    ("allOf", Value::Array(parts)) => {
                        parts.iter_mut().for_each(|p| close_objects(p, true, open))
                    }
                    (_, v) => close_objects(v, false, open),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| close_objects(v, false, open)),
        _ => {}
    }
}

/// The suffix of the open copy of a schema used as a part of an `allOf`.
const OPEN: &str = "__open";

/// `schema` closed, with the document's components (closed, plus the open copies its
/// `allOf`s need) beside it for its `$ref`s.
fn closed(schema: &Map<String, Value>, doc: &Value) -> Value {
    let mut open = Vec::new();
    let mut root = Value::Object(schema.clone());
    close_objects(&mut root, false, &mut open);
    let mut components = doc["components"].clone();
    close_objects(&mut components, false, &mut open);
    for name in open {
        let original = doc["components"]["schemas"][&name].clone();
        components["schemas"][format!("{name}{OPEN}")] = original;
    }
    root["components"] = components;
    root
}

#[test]
fn a_reply_with_a_field_the_document_does_not_name_is_caught() {
    let health = |body: Value| mismatch(&Method::GET, "/healthz", StatusCode::OK, &body);
    assert_eq!(
        health(json!({"instance": "1-2", "status": "ok", "version": "0"})),
        Ok(())
    );
    let extra = health(json!({"instance": "1-2", "status": "ok", "version": "0", "surprise": 1}));
    assert!(
        extra.as_ref().is_err_and(|e| e.contains("surprise")),
        "{extra:?}"
    );
    let missing = health(Value::Object(Map::new()));
    assert!(
        missing.as_ref().is_err_and(|e| e.contains("version")),
        "{missing:?}"
    );
    let undocumented = mismatch(&Method::GET, "/v1/nowhere", StatusCode::OK, &json!({}));
    assert!(undocumented.is_err());
}
