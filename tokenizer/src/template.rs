//! Chat templates: the Jinja `chat_template` of a Hugging Face tokenizer, rendered with
//! `minijinja` as transformers' `apply_chat_template` renders it with Jinja2.
//!
//! What makes the output the same text:
//! - the environment transformers builds: `trim_blocks`, `lstrip_blocks`, no autoescaping, loop
//!   controls, a single trailing newline of the template dropped;
//! - Python's string, dict and list methods (`startswith`, `split`, `strip`, `items`, ...) through
//!   `minijinja-contrib`'s pycompat callback;
//! - `tojson` as transformers defines it: Python's `json.dumps(x, ensure_ascii=False)` (`", "`
//!   and `": "` separators, no HTML escaping, `indent`, `separators` and `sort_keys` honoured);
//! - `raise_exception(message)` failing the render with that message;
//! - the context: `messages`, `tools` (OpenAI function format) when given, `add_generation_prompt`,
//!   the special tokens (`bos_token`, `eos_token`, ...) and any extra keyword (`enable_thinking`).
//!
//! Maps keep the order they are given in (`preserve_order`); Corvid's own maps come sorted by key.

use std::path::Path;

use minijinja::value::{Kwargs, Value};
use minijinja::{AutoEscape, Environment, Error, ErrorKind};
use serde_json::Map;

use crate::TokenizerError;

/// The name templates are registered under in the environment.
const NAME: &str = "chat_template";

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// Where the template came from (a file, or `tokenizer_config.json:chat_template`).
    origin: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

/// What one rendering gets besides the template.
#[derive(Clone, Debug, Default)]
pub struct ChatInput<'a> {
    /// The conversation: OpenAI-style messages (`role`, `content`, `tool_calls`, ...).
    pub messages: &'a [serde_json::Value],
    /// Tool schemas in OpenAI function format, passed as `tools` when present.
    pub tools: Option<&'a [serde_json::Value]>,
    /// Open an assistant turn at the end.
    pub add_generation_prompt: bool,
    /// Special tokens and further keywords (`bos_token`, `eos_token`, `enable_thinking`, ...).
    pub extra: Map<String, serde_json::Value>,
}

fn template_error(origin: &str, e: &Error) -> TokenizerError {
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        message.push_str(&format!(": {s}"));
        source = s.source();
    }
    TokenizerError::Template {
        template: origin.to_string(),
        line: e.line(),
        message,
    }
}

impl ChatTemplate {
    /// Compiles `source`; `origin` names it in errors. A syntax error names the line.
    pub fn new(source: &str, origin: impl Into<String>) -> Result<Self, TokenizerError> {
        let origin = origin.into();
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(NAME, source.to_string())
            .map_err(|e| template_error(&origin, &e))?;
        Ok(ChatTemplate { env, origin })
    }

    /// The chat template of a Hugging Face tokenizer folder: `chat_template.jinja` when the
    /// folder has one (what transformers 5 saves), else `tokenizer_config.json`'s
    /// `chat_template` (a string, or a list of named templates, of which `tool_use` is taken
    /// when `with_tools` and present, else `default`).
    pub fn from_folder(dir: &Path, with_tools: bool) -> Result<Self, TokenizerError> {
        let file = dir.join("chat_template.jinja");
        if file.is_file() {
            let text = std::fs::read_to_string(&file).map_err(io(&file))?;
            return Self::new(&text, file.display().to_string());
        }
        let config = dir.join("tokenizer_config.json");
        let value = read_json(&config)?;
        let origin = format!("{}:chat_template", config.display());
        let source = match value.get("chat_template") {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Array(named)) => {
                let find = |want: &str| {
                    named.iter().find_map(|t| {
                        (t.get("name")?.as_str()? == want)
                            .then(|| t.get("template")?.as_str().map(str::to_string))?
                    })
                };
                let pick = if with_tools { find("tool_use") } else { None };
                pick.or_else(|| find("default"))
                    .ok_or_else(|| TokenizerError::Config {
                        file: config.display().to_string(),
                        problem: "chat_template lists no `default` template".into(),
                    })?
            }
            _ => {
                return Err(TokenizerError::Config {
                    file: config.display().to_string(),
                    problem: "no chat_template (and no chat_template.jinja beside it)".into(),
                })
            }
        };
        Self::new(&source, origin)
    }

    /// Where the template came from.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Whether the template reads the context variable `name` (`enable_thinking`, `tools`):
    /// a keyword it never reads changes nothing.
    pub fn reads(&self, name: &str) -> bool {
        self.env
            .get_template(NAME)
            .map(|t| t.undeclared_variables(false).contains(name))
            .unwrap_or(false)
    }

    /// Renders `input` to text. A failure (including the template's own `raise_exception`)
    /// names the template and the line.
    pub fn render(&self, input: &ChatInput<'_>) -> Result<String, TokenizerError> {
        let mut ctx = input.extra.clone();
        ctx.insert("messages".into(), serde_json::Value::from(input.messages));
        if let Some(tools) = input.tools {
            ctx.insert("tools".into(), serde_json::Value::from(tools));
        }
        ctx.insert(
            "add_generation_prompt".into(),
            input.add_generation_prompt.into(),
        );
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| template_error(&self.origin, &e))?;
        template
            .render(Value::from_serialize(&ctx))
            .map_err(|e| template_error(&self.origin, &e))
    }
}

/// The named special tokens of a tokenizer folder's `tokenizer_config.json` (`bos_token`,
/// `eos_token`, `pad_token`, ..., each a string or an added-token object), as the template
/// context gets them from transformers' `special_tokens_map`. Unset ones are left out.
pub fn special_tokens(dir: &Path) -> Result<Map<String, serde_json::Value>, TokenizerError> {
    let config = dir.join("tokenizer_config.json");
    let value = read_json(&config)?;
    let mut out = Map::new();
    for key in [
        "bos_token",
        "eos_token",
        "unk_token",
        "sep_token",
        "pad_token",
        "cls_token",
        "mask_token",
    ] {
        let text = match value.get(key) {
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(serde_json::Value::Object(o)) => o
                .get("content")
                .and_then(serde_json::Value::as_str)
                .map(str::to_string),
            _ => None,
        };
        if let Some(text) = text {
            out.insert(key.into(), text.into());
        }
    }
    Ok(out)
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TokenizerError + '_ {
    move |e| TokenizerError::Config {
        file: path.display().to_string(),
        problem: e.to_string(),
    }
}

/// A JSON file.
pub(crate) fn read_json(path: &Path) -> Result<serde_json::Value, TokenizerError> {
    let text = std::fs::read_to_string(path).map_err(io(path))?;
    serde_json::from_str(&text).map_err(|e| TokenizerError::Config {
        file: path.display().to_string(),
        problem: format!("not valid JSON: {e}"),
    })
}

/// `raise_exception(message)`: the template refuses its input.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// transformers' `tojson`: `json.dumps(value, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)`.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_i64() {
            Some(n) => Some(" ".repeat(n.max(0) as usize)),
            None => Some(v.as_str().unwrap_or_default().to_string()),
        },
    };
    // Python's defaults: (", ", ": "), or (",", ": ") with an indent.
    let (item, key) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be a pair",
            ))
        }
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let mut out = String::new();
    PyJson {
        indent,
        item,
        key,
        sort_keys: sort_keys.unwrap_or(false),
    }
    .write(&json, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

/// `value` as Python's `json.dumps(value, ensure_ascii=False)` writes it (what a template's
/// `tojson` writes): `", "` and `": "` separators, maps in their order, strings unescaped
/// beyond JSON's needs.
pub fn python_json(value: &serde_json::Value) -> String {
    let mut out = String::new();
    PyJson {
        indent: None,
        item: ", ".into(),
        key: ": ".into(),
        sort_keys: false,
    }
    .write(value, 0, &mut out);
    out
}

/// Python's `json.dumps` layout.
struct PyJson {
    indent: Option<String>,
    item: String,
    key: String,
    sort_keys: bool,
}

impl PyJson {
    fn newline(&self, depth: usize, out: &mut String) {
        if let Some(ind) = &self.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(ind);
            }
        }
    }

    fn write(&self, v: &serde_json::Value, depth: usize, out: &mut String) {
        use serde_json::Value as J;
        match v {
            J::Null => out.push_str("null"),
            J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            J::Number(n) => out.push_str(&py_number(n)),
            J::String(s) => write_py_string(s, out),
            J::Array(items) if items.is_empty() => out.push_str("[]"),
            J::Array(items) => {
                out.push('[');
                for (i, x) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item);
                    }
                    self.newline(depth + 1, out);
                    self.write(x, depth + 1, out);
                }
                self.newline(depth, out);
                out.push(']');
            }
            J::Object(map) if map.is_empty() => out.push_str("{}"),
            J::Object(map) => {
                let mut entries: Vec<(&String, &serde_json::Value)> = map.iter().collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (i, (k, x)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item);
                    }
                    self.newline(depth + 1, out);
                    write_py_string(k, out);
                    out.push_str(&self.key);
                    self.write(x, depth + 1, out);
                }
                self.newline(depth, out);
                out.push('}');
            }
        }
    }
}

/// A number as Python's `repr` writes it (`1.0`, `1e-05`, `1e+20`).
fn py_number(n: &serde_json::Number) -> String {
    if let Some(i) = n.as_i64() {
        return i.to_string();
    }
    if let Some(u) = n.as_u64() {
        return u.to_string();
    }
    let f = n.as_f64().unwrap_or(f64::NAN);
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let abs = f.abs();
    if abs != 0.0 && !(1e-4..1e16).contains(&abs) {
        // Scientific: the shortest digits, a signed two-digit exponent.
        let s = format!("{f:e}");
        let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let exp: i32 = exp.parse().unwrap_or(0);
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exp.abs());
    }
    let s = format!("{f}");
    if s.contains('.') {
        s
    } else {
        format!("{s}.0")
    }
}

/// A string as `json.dumps(..., ensure_ascii=False)` writes it: `"`, `\` and control
/// characters escaped (`\n`, `\r`, `\t`, `\b`, `\f`, else `\u00XX`), everything else as is.
fn write_py_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(src: &str, messages: serde_json::Value) -> Result<String, TokenizerError> {
        let t = ChatTemplate::new(src, "test")?;
        let msgs = messages.as_array().unwrap().clone();
        t.render(&ChatInput {
            messages: &msgs,
            ..ChatInput::default()
        })
    }

    #[test]
    fn tojson_writes_what_python_json_dumps_writes() {
        let out = render(
            "{{ messages[0] | tojson }}|{{ messages[0] | tojson(indent=2) }}",
            json!([{"a": [1, 2.5, 1e-5, 1e20], "b": "<x> & \"q\"\n\u{e9}", "c": {}, "d": null}]),
        )
        .unwrap();
        assert_eq!(
            out,
            "{\"a\": [1, 2.5, 1e-05, 1e+20], \"b\": \"<x> & \\\"q\\\"\\n\u{e9}\", \"c\": {}, \"d\": null}|{\n  \"a\": [\n    1,\n    2.5,\n    1e-05,\n    1e+20\n  ],\n  \"b\": \"<x> & \\\"q\\\"\\n\u{e9}\",\n  \"c\": {},\n  \"d\": null\n}"
        );
    }

    #[test]
    fn python_methods_blocks_and_errors() {
        // trim_blocks drops the newline after a block tag, not after an expression (as Jinja2).
        let src =
            "{% for m in messages %}\n  {{- m.content.split('|')[-1].strip() }}\n{% endfor %}";
        assert_eq!(
            render(src, json!([{"content": "a| b "}, {"content": "c"}])).unwrap(),
            "b\nc\n"
        );
        let e = render("ok\n{{ raise_exception('no system role') }}", json!([]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no system role") && e.contains("line 2"), "{e}");
        let e = ChatTemplate::new("{% for m in messages %}", "broken.jinja")
            .unwrap_err()
            .to_string();
        assert!(e.contains("broken.jinja") && e.contains("line 1"), "{e}");
    }
}
