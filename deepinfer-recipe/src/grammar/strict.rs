//! Strict tool schemas: the normal form a `strict: true` tool's parameters
//! are enforced in, following OpenAI's structured-output rules.
//!
//! Every object gets `additionalProperties: false` (any other value is an
//! error) and lists all its properties as required, in declared order
//! (optional values are expressed as a type union with `null`). Keywords
//! this crate cannot enforce are an error naming the keyword and where it
//! is, rather than a promise the grammar would silently not keep.

use serde_json::{Map, Value};

use super::GrammarError;

/// Keywords a strict schema may use: structure, documentation, and the
/// constraints the grammar backend enforces.
const ALLOWED: &[&str] = &[
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "const",
    "anyOf",
    "$ref",
    "$defs",
    "definitions",
    "description",
    "title",
    "default",
    "examples",
    "$schema",
    "$id",
    "$comment",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    // Integer bounds only (checked in `normalize`).
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
];

/// Bounds the grammar enforces on integers, and on nothing else.
const INTEGER_BOUNDS: &[&str] = &["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"];

fn error(path: &str, what: impl std::fmt::Display) -> GrammarError {
    GrammarError::Unsupported(format!("strict schema at `{path}`: {what}"))
}

/// A tool's parameter schema in strict normal form when the tool is strict
/// (`strict: true`), else `None` (its parameters are not constrained).
pub(crate) fn strict_tool_parameters(
    tool: &crate::ToolDefinition,
) -> Result<Option<Value>, GrammarError> {
    if tool.strict != Some(true) {
        return Ok(None);
    }
    strict_schema(&tool.parameters)
        .map(Some)
        .map_err(|error| GrammarError::Unsupported(format!("tool `{}`: {error}", tool.name)))
}

/// The strict normal form of a tool's parameter schema (an object schema).
pub fn strict_schema(schema: &Value) -> Result<Value, GrammarError> {
    let kind = schema.get("type").and_then(Value::as_str);
    if !schema.is_object() || !(kind == Some("object") || kind.is_none()) {
        return Err(error("#", "the parameters must be an object schema"));
    }
    normalize(schema, "#")
}

fn normalize(schema: &Value, path: &str) -> Result<Value, GrammarError> {
    let Some(object) = schema.as_object() else {
        return match schema {
            Value::Bool(true) => Err(error(path, "`true` (any value) cannot be strict")),
            _ => Err(error(path, format!("{schema} is not a schema"))),
        };
    };
    if let Some(key) = object.keys().find(|key| !ALLOWED.contains(&key.as_str())) {
        return Err(error(
            path,
            format!("keyword `{key}` is not supported in strict mode (it cannot be enforced)"),
        ));
    }
    if let Some(key) = object
        .keys()
        .find(|key| INTEGER_BOUNDS.contains(&key.as_str()))
        && object.get("type").and_then(Value::as_str) != Some("integer")
    {
        return Err(error(
            path,
            format!("keyword `{key}` is enforced only on `\"type\": \"integer\"`"),
        ));
    }
    let mut out = Map::new();
    for (key, value) in object {
        let inner = format!("{path}/{key}");
        let normalized = match key.as_str() {
            "items" => normalize(value, &inner)?,
            "anyOf" => Value::Array(
                value
                    .as_array()
                    .ok_or_else(|| error(&inner, "must be a list"))?
                    .iter()
                    .enumerate()
                    .map(|(i, option)| normalize(option, &format!("{inner}/{i}")))
                    .collect::<Result<_, _>>()?,
            ),
            "$defs" | "definitions" => Value::Object(
                value
                    .as_object()
                    .ok_or_else(|| error(&inner, "must be an object"))?
                    .iter()
                    .map(|(name, def)| {
                        Ok((name.clone(), normalize(def, &format!("{inner}/{name}"))?))
                    })
                    .collect::<Result<_, GrammarError>>()?,
            ),
            _ => value.clone(),
        };
        out.insert(key.clone(), normalized);
    }
    let is_object = match object.get("type") {
        Some(Value::String(kind)) => kind == "object",
        Some(Value::Array(kinds)) => kinds.iter().any(|k| k == "object"),
        _ => object.contains_key("properties"),
    };
    if is_object {
        normalize_object(object, &mut out, path)?;
    }
    Ok(Value::Object(out))
}

fn normalize_object(
    object: &Map<String, Value>,
    out: &mut Map<String, Value>,
    path: &str,
) -> Result<(), GrammarError> {
    match object.get("additionalProperties") {
        None | Some(Value::Bool(false)) => {}
        Some(other) => {
            return Err(error(
                path,
                format!("additionalProperties must be false in strict mode, not {other}"),
            ));
        }
    }
    let empty = Map::new();
    let properties = match object.get("properties") {
        None => &empty,
        Some(Value::Object(properties)) => properties,
        Some(_) => return Err(error(path, "properties must be an object")),
    };
    if let Some(required) = object.get("required") {
        let listed = required
            .as_array()
            .ok_or_else(|| error(path, "required must be a list"))?;
        for name in listed {
            let known = name.as_str().is_some_and(|n| properties.contains_key(n));
            if !known {
                return Err(error(
                    path,
                    format!("required names {name}, which is not a property"),
                ));
            }
        }
    }
    let mut normalized = Map::new();
    for (name, schema) in properties {
        normalized.insert(
            name.clone(),
            normalize(schema, &format!("{path}/properties/{name}"))?,
        );
    }
    out.insert(
        "required".into(),
        Value::Array(properties.keys().cloned().map(Value::String).collect()),
    );
    out.insert("properties".into(), Value::Object(normalized));
    out.insert("additionalProperties".into(), Value::Bool(false));
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn objects_get_all_required_and_no_additional_properties() {
        let schema = json!({
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "stops": {"type": "array", "items": {"type": "object", "properties": {"at": {"type": ["string", "null"]}}}},
            },
            "required": ["city"],
        });
        let strict = strict_schema(&schema).unwrap();
        assert_eq!(strict["required"], json!(["city", "stops"]));
        assert_eq!(strict["additionalProperties"], json!(false));
        let item = &strict["properties"]["stops"]["items"];
        assert_eq!(item["required"], json!(["at"]));
        assert_eq!(item["additionalProperties"], json!(false));
        // Normalising twice changes nothing.
        assert_eq!(strict_schema(&strict).unwrap(), strict);
    }

    #[test]
    fn integer_bounds_are_kept() {
        let schema = json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "exclusiveMaximum": 10}}});
        let strict = strict_schema(&schema).unwrap();
        assert_eq!(strict["properties"]["n"]["minimum"], json!(1));
    }

    #[test]
    fn unsupported_keywords_and_open_objects_are_errors() {
        for (schema, needle) in [
            (
                json!({"type": "object", "properties": {"n": {"type": "number", "minimum": 0}}}),
                "`minimum`",
            ),
            (
                json!({"type": "object", "properties": {"s": {"type": "string", "pattern": "a+"}}}),
                "`pattern`",
            ),
            (
                json!({"type": "object", "additionalProperties": true}),
                "additionalProperties",
            ),
            (
                json!({"type": "object", "properties": {"o": {"type": "object", "additionalProperties": {"type": "string"}}}}),
                "#/properties/o",
            ),
            (
                json!({"type": "object", "properties": {}, "required": ["x"]}),
                "not a property",
            ),
            (json!({"type": "string"}), "object schema"),
            (
                json!({"type": "object", "properties": {"a": {"oneOf": [{"type": "string"}]}}}),
                "`oneOf`",
            ),
        ] {
            let message = strict_schema(&schema).unwrap_err().to_string();
            assert!(message.contains(needle), "{message} lacks {needle}");
        }
    }
}
