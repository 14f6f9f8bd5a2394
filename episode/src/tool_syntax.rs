//! The text syntaxes models write tool calls in: how a list of calls is written in an
//! assistant turn, and how a generated turn's text is read back into calls. Each syntax writes
//! what its model family's chat template writes for the same calls, so a rendered history and a
//! generated turn read alike.
//!
//! | syntax | models | one call |
//! |---|---|---|
//! | [`Hermes`](ToolCallSyntax::Hermes) | Qwen3, Qwen3-MoE (and Hermes-style templates) | `<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>`, calls separated by `\n` |
//! | [`DeepseekV3`](ToolCallSyntax::DeepseekV3) | DeepSeek-V3, DeepSeek-R1 (and its distills) | `<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{...}\n```<｜tool▁call▁end｜>`, calls separated by `\n`, all inside `<｜tool▁calls▁begin｜>…<｜tool▁calls▁end｜>` |
//! | [`DeepseekV31`](ToolCallSyntax::DeepseekV31) | DeepSeek-V3.1 | `<｜tool▁call▁begin｜>f<｜tool▁sep｜>{...}<｜tool▁call▁end｜>`, all inside `<｜tool▁calls▁begin｜>…<｜tool▁calls▁end｜>` |
//! | [`KimiK2`](ToolCallSyntax::KimiK2) | Kimi K2 | `<\|tool_call_begin\|>functions.f:0<\|tool_call_argument_begin\|>{...}<\|tool_call_end\|>`, all inside `<\|tool_calls_section_begin\|>…<\|tool_calls_section_end\|>` |
//! | [`Corvid`](ToolCallSyntax::Corvid) | Corvid's byte policies | `<tool_call>{"name":"f","arguments":{...}}</tool_call>` |
//!
//! Arguments are JSON objects, written as Python's `json.dumps` writes them (the templates'
//! `tojson`) in a model's syntax, as the call holds them in Corvid's. A turn that does not parse is a
//! [`CallParseError`], which the actor answers as a malformed call.

use corvid_proto::ToolCall;
use corvid_tokenizer::python_json;
use serde::{Deserialize, Serialize};

use crate::format::CallParseError;

/// How a model writes tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolCallSyntax {
    /// `<tool_call>` JSON `</tool_call>` (Qwen3, Hermes).
    Hermes,
    /// DeepSeek-V3's and R1's `function<｜tool▁sep｜>` blocks with a fenced JSON body.
    DeepseekV3,
    /// DeepSeek-V3.1's `<｜tool▁call▁begin｜>` blocks.
    DeepseekV31,
    /// Kimi K2's `<|tool_call_begin|>` sections.
    KimiK2,
    /// Corvid's byte policies: compact JSON between `<tool_call>` and `</tool_call>`.
    Corvid,
}

/// The markers of a syntax that wraps all calls of a turn in a section.
struct Markers {
    section: Option<(&'static str, &'static str)>,
    call: (&'static str, &'static str),
    /// Between the call's name (or id) and its arguments.
    sep: &'static str,
}

const DEEPSEEK: Markers = Markers {
    section: Some(("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")),
    call: ("<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"),
    sep: "<｜tool▁sep｜>",
};

const KIMI: Markers = Markers {
    section: Some(("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>")),
    call: ("<|tool_call_begin|>", "<|tool_call_end|>"),
    sep: "<|tool_call_argument_begin|>",
};

impl ToolCallSyntax {
    /// Every syntax, by its configuration name.
    pub const ALL: [(&'static str, ToolCallSyntax); 5] = [
        ("hermes", ToolCallSyntax::Hermes),
        ("deepseek_v3", ToolCallSyntax::DeepseekV3),
        ("deepseek_v31", ToolCallSyntax::DeepseekV31),
        ("kimi_k2", ToolCallSyntax::KimiK2),
        ("corvid", ToolCallSyntax::Corvid),
    ];

    /// The syntax's configuration name (`[model] tool_call_format`).
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, s)| *s == self)
            .map_or("", |(n, _)| n)
    }

    /// The text that opens a call (or the section of calls): a turn holding it attempts one.
    pub fn call_marker(self) -> &'static str {
        match self {
            ToolCallSyntax::Hermes | ToolCallSyntax::Corvid => "<tool_call>",
            ToolCallSyntax::DeepseekV3 | ToolCallSyntax::DeepseekV31 => DEEPSEEK.call.0,
            ToolCallSyntax::KimiK2 => KIMI.call.0,
        }
    }

    /// The syntax of a Hugging Face `model_type`, when its family has one.
    pub fn for_model_type(model_type: &str) -> Option<Self> {
        match model_type {
            "qwen3" | "qwen3_moe" => Some(ToolCallSyntax::Hermes),
            "deepseek_v3" => Some(ToolCallSyntax::DeepseekV31),
            "kimi_k2" => Some(ToolCallSyntax::KimiK2),
            "corvid" => Some(ToolCallSyntax::Corvid),
            _ => None,
        }
    }

    /// The syntax named `name` (`[model] tool_call_format`); the error lists the names.
    pub fn from_name(name: &str) -> Result<Self, String> {
        Self::ALL
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| *s)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|(n, _)| *n).collect();
                format!(
                    "unknown tool-call format {name:?} (known: {})",
                    names.join(", ")
                )
            })
    }

    /// The text of an assistant turn that makes `calls`, in order (none: no text).
    pub fn render(self, calls: &[ToolCall]) -> String {
        if calls.is_empty() {
            return String::new();
        }
        match self {
            ToolCallSyntax::Hermes => calls
                .iter()
                .map(|c| {
                    format!(
                        "<tool_call>\n{{\"name\": {}, \"arguments\": {}}}\n</tool_call>",
                        python_json(&serde_json::Value::String(c.name.clone())),
                        self.written_arguments(c)
                    )
                })
                .collect::<Vec<_>>()
                .join("\n"),
            ToolCallSyntax::Corvid => calls
                .iter()
                .map(|c| {
                    format!(
                        "<tool_call>{{\"name\":{},\"arguments\":{}}}</tool_call>",
                        serde_json::Value::String(c.name.clone()),
                        c.arguments_json
                    )
                })
                .collect(),
            ToolCallSyntax::DeepseekV3 => {
                let (open, close) = DEEPSEEK.section.unwrap_or_default();
                let body: Vec<String> = calls
                    .iter()
                    .map(|c| {
                        format!(
                            "{}function{}{}\n```json\n{}\n```{}",
                            DEEPSEEK.call.0,
                            DEEPSEEK.sep,
                            c.name,
                            self.written_arguments(c),
                            DEEPSEEK.call.1
                        )
                    })
                    .collect();
                format!("{open}{}{close}", body.join("\n"))
            }
            ToolCallSyntax::DeepseekV31 => sectioned(
                &DEEPSEEK,
                calls,
                |_, c| c.name.clone(),
                |c| self.written_arguments(c),
            ),
            ToolCallSyntax::KimiK2 => sectioned(
                &KIMI,
                calls,
                |i, c| format!("functions.{}:{i}", c.name),
                |c| self.written_arguments(c),
            ),
        }
    }

    /// The arguments of `call` as this syntax writes them: as Python's `json.dumps` (what the
    /// released templates' `tojson` writes) for a model's syntax, as the call holds them for
    /// Corvid's. A chat export carries this text, which a template writes back verbatim.
    pub fn written_arguments(self, call: &ToolCall) -> String {
        match self {
            ToolCallSyntax::Corvid => call.arguments_json.clone(),
            _ => serde_json::from_str::<serde_json::Value>(&call.arguments_json)
                .map(|v| python_json(&v))
                .unwrap_or_else(|_| call.arguments_json.clone()),
        }
    }

    /// The id of the call to `name` that the episode's `n`-th turn makes, which the tool
    /// message answering it names: Kimi K2's `functions.{name}:0` (the id the model writes,
    /// which its template shows back as `## Return of {id}`), else `call_{n}`.
    pub fn call_id(self, name: &str, n: usize) -> String {
        match self {
            ToolCallSyntax::KimiK2 => format!("functions.{name}:0"),
            _ => format!("call_{n}"),
        }
    }

    /// The calls a generated turn's text makes, in order. Text before the first call is
    /// allowed (and ignored); a turn without a call, an unclosed call, a body that is not JSON
    /// or lacks a name, or arguments that are not an object are errors.
    pub fn parse(self, text: &str) -> Result<Vec<ToolCall>, CallParseError> {
        match self {
            ToolCallSyntax::Hermes | ToolCallSyntax::Corvid => {
                let mut calls = Vec::new();
                let mut rest = text;
                while let Some(start) = rest.find("<tool_call>") {
                    let body = &rest[start + "<tool_call>".len()..];
                    let end = body.find("</tool_call>").ok_or(CallParseError::Unclosed)?;
                    calls.push(json_call(body[..end].trim())?);
                    rest = &body[end + "</tool_call>".len()..];
                }
                if calls.is_empty() {
                    return Err(CallParseError::NoCall);
                }
                Ok(calls)
            }
            ToolCallSyntax::DeepseekV3 => parse_fenced(text),
            ToolCallSyntax::DeepseekV31 => {
                parse_sectioned(&DEEPSEEK, text, |name| Some(name.to_string()))
            }
            ToolCallSyntax::KimiK2 => parse_sectioned(&KIMI, text, |id| {
                // `functions.{name}:{index}`; a bare name is accepted too.
                let id = id.strip_prefix("functions.").unwrap_or(id);
                Some(id.rsplit_once(':').map_or(id, |(name, _)| name).to_string())
            }),
        }
    }
}

/// Calls inside a section, each `call.0 {head} sep {arguments} call.1`.
fn sectioned(
    m: &Markers,
    calls: &[ToolCall],
    head: impl Fn(usize, &ToolCall) -> String,
    written: impl Fn(&ToolCall) -> String,
) -> String {
    let mut out = String::new();
    if let Some((open, _)) = m.section {
        out.push_str(open);
    }
    for (i, c) in calls.iter().enumerate() {
        out.push_str(m.call.0);
        out.push_str(&head(i, c));
        out.push_str(m.sep);
        out.push_str(&written(c));
        out.push_str(m.call.1);
    }
    if let Some((_, close)) = m.section {
        out.push_str(close);
    }
    out
}

fn parse_sectioned(
    m: &Markers,
    text: &str,
    name_of: impl Fn(&str) -> Option<String>,
) -> Result<Vec<ToolCall>, CallParseError> {
    let body = match m.section {
        Some((open, close)) => {
            let start = text.find(open).ok_or(CallParseError::NoCall)?;
            let inner = &text[start + open.len()..];
            let end = inner.find(close).ok_or(CallParseError::Unclosed)?;
            &inner[..end]
        }
        None => text,
    };
    let mut calls = Vec::new();
    let mut rest = body;
    while let Some(start) = rest.find(m.call.0) {
        let call = &rest[start + m.call.0.len()..];
        let end = call.find(m.call.1).ok_or(CallParseError::Unclosed)?;
        let (head, args) = call[..end]
            .split_once(m.sep)
            .ok_or_else(|| CallParseError::Json("no arguments after the call's name".into()))?;
        let name = name_of(head.trim()).ok_or(CallParseError::MissingName)?;
        if name.is_empty() {
            return Err(CallParseError::MissingName);
        }
        calls.push(ToolCall {
            name,
            arguments_json: arguments_object(args.trim())?,
        });
        rest = &call[end + m.call.1.len()..];
    }
    if calls.is_empty() {
        return Err(CallParseError::NoCall);
    }
    Ok(calls)
}

/// DeepSeek-V3's calls: inside the section, each
/// `call.0 function sep {name}\n```json\n{arguments}\n``` call.1`.
fn parse_fenced(text: &str) -> Result<Vec<ToolCall>, CallParseError> {
    let (open, close) = DEEPSEEK.section.unwrap_or_default();
    let start = text.find(open).ok_or(CallParseError::NoCall)?;
    let inner = &text[start + open.len()..];
    let end = inner.find(close).ok_or(CallParseError::Unclosed)?;
    let mut rest = &inner[..end];
    let mut calls = Vec::new();
    while let Some(at) = rest.find(DEEPSEEK.call.0) {
        let call = &rest[at + DEEPSEEK.call.0.len()..];
        let stop = call.find(DEEPSEEK.call.1).ok_or(CallParseError::Unclosed)?;
        let (_, named) = call[..stop]
            .split_once(DEEPSEEK.sep)
            .ok_or_else(|| CallParseError::Json("no name after the call's type".into()))?;
        let (name, fenced) = named
            .split_once("\n```json\n")
            .ok_or_else(|| CallParseError::Json("no ```json block after the call's name".into()))?;
        let args = fenced
            .trim_end()
            .strip_suffix("```")
            .ok_or(CallParseError::Unclosed)?;
        if name.trim().is_empty() {
            return Err(CallParseError::MissingName);
        }
        calls.push(ToolCall {
            name: name.trim().to_string(),
            arguments_json: arguments_object(args.trim())?,
        });
        rest = &call[stop + DEEPSEEK.call.1.len()..];
    }
    if calls.is_empty() {
        return Err(CallParseError::NoCall);
    }
    Ok(calls)
}

/// Arguments written as JSON text: an object (returned as written), or empty for none.
fn arguments_object(text: &str) -> Result<String, CallParseError> {
    if text.is_empty() {
        return Ok("{}".into());
    }
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(_)) => Ok(text.to_string()),
        Ok(_) => Err(CallParseError::ArgumentsNotObject),
        Err(e) => Err(CallParseError::Json(e.to_string())),
    }
}

/// A `{"name": ..., "arguments": ...}` body, where `arguments` may also be a string holding
/// the object, or absent (`{}`). The byte layout's calls read through it too.
pub(crate) fn json_call(body: &str) -> Result<ToolCall, CallParseError> {
    let v: serde_json::Value =
        serde_json::from_str(body).map_err(|e| CallParseError::Json(e.to_string()))?;
    let name = v
        .get("name")
        .and_then(|n| n.as_str())
        .ok_or(CallParseError::MissingName)?;
    let arguments_json = match v.get("arguments") {
        None | Some(serde_json::Value::Null) => "{}".to_string(),
        Some(a @ serde_json::Value::Object(_)) => a.to_string(),
        Some(serde_json::Value::String(s)) => match serde_json::from_str(s) {
            Ok(serde_json::Value::Object(_)) => s.clone(),
            _ => return Err(CallParseError::ArgumentsNotObject),
        },
        Some(_) => return Err(CallParseError::ArgumentsNotObject),
    };
    Ok(ToolCall {
        name: name.to_string(),
        arguments_json,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, args: &str) -> ToolCall {
        ToolCall {
            name: name.into(),
            arguments_json: args.into(),
        }
    }

    fn same_calls(a: &[ToolCall], b: &[ToolCall]) -> bool {
        let value = |s: &str| serde_json::from_str::<serde_json::Value>(s).unwrap();
        a.len() == b.len()
            && a.iter().zip(b).all(|(x, y)| {
                x.name == y.name && value(&x.arguments_json) == value(&y.arguments_json)
            })
    }

    #[test]
    fn every_syntax_reads_back_what_it_writes() {
        let calls = vec![
            call("read_file", r#"{"path":"notes/a.txt"}"#),
            call(
                "run",
                r#"{"cmd":"printf 'caf\u00e9 \"q\"\n'","timeout_s":1e-05,"env":{"A":[1,2]}}"#,
            ),
            call("list", "{}"),
        ];
        for (name, syntax) in ToolCallSyntax::ALL {
            assert_eq!(ToolCallSyntax::from_name(name), Ok(syntax));
            let text = syntax.render(&calls);
            let back = syntax.parse(&format!("Let me look.\n{text}")).unwrap();
            assert!(same_calls(&back, &calls), "{name}: {text} -> {back:?}");
            assert!(same_calls(
                &syntax.parse(&text[..]).unwrap()[..1],
                &calls[..1]
            ));
        }
        assert!(ToolCallSyntax::from_name("xml")
            .unwrap_err()
            .contains("hermes, deepseek_v3, deepseek_v31, kimi_k2, corvid"));
    }

    #[test]
    fn each_syntax_writes_what_its_template_writes() {
        let text = ToolCallSyntax::Hermes.render(&[
            call("read_file", r#"{"path":"a"}"#),
            call("run", r#"{"cmd":"cat b | wc -l","timeout_s":1.0}"#),
        ]);
        assert_eq!(
            text,
            "<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"run\", \"arguments\": {\"cmd\": \"cat b | wc -l\", \"timeout_s\": 1.0}}\n</tool_call>"
        );
        assert_eq!(
            ToolCallSyntax::KimiK2.render(&[call("f", "{}"), call("g", r#"{"x":1}"#)]),
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_call_begin|>functions.g:1<|tool_call_argument_begin|>{\"x\": 1}<|tool_call_end|><|tool_calls_section_end|>"
        );
        assert_eq!(
            ToolCallSyntax::DeepseekV31.render(&[call("f", r#"{"x":1}"#)]),
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"x\": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
        );
        assert_eq!(
            ToolCallSyntax::DeepseekV3.render(&[call("f", r#"{"x":1}"#), call("g", "{}")]),
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"x\": 1}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>g\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
        );
    }

    #[test]
    fn malformed_turns_are_named() {
        use CallParseError as E;
        let cases: Vec<(ToolCallSyntax, &str, E)> = vec![
            (ToolCallSyntax::Hermes, "I will answer directly.", E::NoCall),
            (ToolCallSyntax::Hermes, "<tool_call>\n{\"name\": \"f\"", E::Unclosed),
            (
                ToolCallSyntax::Hermes,
                "<tool_call>{\"arguments\": {}}</tool_call>",
                E::MissingName,
            ),
            (
                ToolCallSyntax::Corvid,
                "<tool_call>{\"name\":\"f\",\"arguments\":[1]}</tool_call>",
                E::ArgumentsNotObject,
            ),
            (
                ToolCallSyntax::KimiK2,
                "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{}",
                E::Unclosed,
            ),
            (
                ToolCallSyntax::DeepseekV31,
                "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>\"x\"<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
                E::ArgumentsNotObject,
            ),
            (ToolCallSyntax::DeepseekV31, "plain text", E::NoCall),
        ];
        for (syntax, text, want) in cases {
            assert_eq!(syntax.parse(text), Err(want), "{syntax:?}: {text}");
        }
        assert!(matches!(
            ToolCallSyntax::Hermes.parse("<tool_call>{name: f}</tool_call>"),
            Err(E::Json(_))
        ));
    }
}

#[cfg(test)]
mod template_tests {
    use super::*;

    /// The Hermes text of the calls in the ChatML tokenizer fixture's conversations is what
    /// transformers rendered there (`tokenizer/tests/fixtures/chatml_tools/expected.json`).
    #[test]
    fn hermes_calls_appear_verbatim_in_transformers_renderings() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tokenizer/tests/fixtures/chatml_tools/expected.json");
        let expected: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let mut seen = 0;
        for case in expected["cases"].as_array().unwrap() {
            let Some(text) = case["text"].as_str() else {
                continue;
            };
            for m in case["messages"].as_array().unwrap() {
                let Some(tool_calls) = m["tool_calls"].as_array() else {
                    continue;
                };
                let calls: Vec<ToolCall> = tool_calls
                    .iter()
                    .map(|c| ToolCall {
                        name: c["function"]["name"].as_str().unwrap().into(),
                        arguments_json: c["function"]["arguments"].to_string(),
                    })
                    .collect();
                let rendered = ToolCallSyntax::Hermes.render(&calls);
                assert!(text.contains(&rendered), "{}: {rendered}", case["name"]);
                // The assistant turn with the calls (the system turn before it names the tags).
                let turn = text
                    .split("<|im_start|>assistant\n")
                    .skip(1)
                    .find(|t| t.contains("<tool_call>"))
                    .unwrap();
                assert!(
                    calls.len() == ToolCallSyntax::Hermes.parse(turn).unwrap().len(),
                    "{turn}"
                );
                seen += 1;
            }
        }
        assert_eq!(seen, 3);
    }
}
