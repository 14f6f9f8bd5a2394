//! The released chat templates (Qwen3 with thinking on and off, Qwen3-2507 Instruct,
//! DeepSeek-V3, DeepSeek-V3.1 with thinking on and off, Kimi K2, and R1-Distill's, which cannot lay out tool use) with
//! their released tokenizers, fetched by the bootstrap into `.corvid/released`
//! (`scripts/released_files.py`; provenance in `episode/tests/released/README.md`).
//!
//! transformers is the oracle (`scripts/released_templates.py`): for short tool conversations
//! (calls and results, an error, with and without thinking) an episode built turn by turn has
//! - the prompt transformers renders;
//! - after each generated turn, exactly the segment cut from transformers' rendering of the
//!   real conversation at the end of that turn;
//! - a conversation whose messages are the ones transformers rendered (the chat export),
//!   which imports back as the same episode;
//! - where the template extends turn by turn, the ids of transformers' full rendering, and
//!   where it does not, a named difference ([`ChatFormat::divergence`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use corvid_episode::{ChatFormat, ChatMessage, Conversation, EpisodeFormat, ToolCallSyntax};
use corvid_proto::ToolCall;
use corvid_tokenizer::{ChatTemplate, TurnRenderer};
use serde_json::{Map, Value};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn released() -> PathBuf {
    let dir = root().join(".corvid/released");
    assert!(
        dir.join("qwen3/tokenizer.json").is_file(),
        "{} has no released files: run `make bootstrap` (scripts/bootstrap.sh fetches them)",
        dir.display()
    );
    dir
}

/// transformers' renderings of every case (see `scripts/released_templates.py`).
fn oracle() -> Vec<Value> {
    let out = Command::new(root().join(".corvid/venv/bin/python"))
        .arg(root().join("scripts/released_templates.py"))
        .arg("--released")
        .arg(released())
        .output()
        .expect("the bootstrapped virtualenv's python runs");
    assert!(
        out.status.success(),
        "released_templates.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the oracle prints JSON")
}

/// What the model generates for an assistant message: its reasoning block, its text, its
/// calls in the folder's syntax, the end of the turn. DeepSeek-V3.1's generation prompt
/// already opens `<think>`, so its model writes `reasoning</think>`; Qwen3's writes the block.
fn generated_text(m: &Value, syntax: ToolCallSyntax, eot: &str) -> String {
    let think = m["reasoning_content"]
        .as_str()
        .map(|r| match syntax {
            ToolCallSyntax::DeepseekV31 => format!("{r}</think>"),
            _ => format!("<think>\n{r}\n</think>\n\n"),
        })
        .unwrap_or_default();
    let calls: Vec<ToolCall> = m["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let args = &c["function"]["arguments"];
            ToolCall {
                name: c["function"]["name"].as_str().unwrap().to_string(),
                arguments_json: args
                    .as_str()
                    .map_or_else(|| args.to_string(), str::to_string),
            }
        })
        .collect();
    let content = m["content"].as_str().unwrap_or_default();
    format!("{think}{content}{}{eot}", syntax.render(&calls))
}

fn kwargs_of(line: &Value) -> Map<String, Value> {
    line["kwargs"].as_object().cloned().unwrap_or_default()
}

/// The folder's episode format with the case's keywords.
fn chat_layout(dir: &Path, syntax: ToolCallSyntax, line: &Value) -> EpisodeFormat {
    EpisodeFormat::chat(ChatFormat::from_folder_with(dir, syntax, &kwargs_of(line)).unwrap())
}

/// Builds the case's episode turn by turn in the folder's [`ChatFormat`], checks each piece
/// against the oracle and returns the named difference, if any.
fn episode_in_format(dir: &Path, line: &Value) -> Option<String> {
    let what = format!("{} {} {}", line["folder"], line["case"], line["kwargs"]);
    let syntax = ToolCallSyntax::from_name(line["syntax"].as_str().unwrap()).unwrap();
    let eot = line["end_of_turn"].as_str().unwrap();
    let chat = ChatFormat::from_folder_with(dir, syntax, &kwargs_of(line)).unwrap();
    let tok = chat.tokenizer();
    let messages = line["messages"].as_array().unwrap();
    let mut conversation = Conversation {
        messages: vec![ChatMessage::text(
            "user",
            messages[0]["content"].as_str().unwrap(),
        )],
        tools: line["tools"].as_array().unwrap().clone(),
    };
    let mut ids = chat.prompt_ids(&conversation).unwrap();
    assert_eq!(
        tok.decode(&ids).unwrap(),
        line["prompt"],
        "{what}: the prompt"
    );
    let segments = line["segments"].as_array().unwrap();
    let assistant: Vec<usize> = (0..messages.len())
        .filter(|&i| messages[i]["role"] == "assistant")
        .collect();
    for (n, &i) in assistant.iter().enumerate() {
        let generated = tok
            .encode(&generated_text(&messages[i], syntax, eot))
            .unwrap();
        ids.extend(&generated);
        match assistant.get(n + 1) {
            Some(&next) => {
                assert_eq!(next, i + 2, "{what}: one tool message after each turn");
                let text = messages[i + 1]["content"].as_str().unwrap();
                let segment = chat
                    .result_ids(&mut conversation, &generated, text)
                    .unwrap();
                assert_eq!(
                    tok.decode(&segment).unwrap(),
                    segments[n],
                    "{what}: the segment after turn {n}"
                );
                ids.extend(segment);
            }
            None => chat.close(&mut conversation, &generated),
        }
    }
    // The conversation the episode was built from is what transformers rendered: the chat
    // export's messages.
    assert_eq!(
        Value::from(chat.template_messages(&conversation.messages)),
        line["messages"],
        "{what}: the conversation"
    );
    // The export imports back as the episode: reasoning where the template puts it, each
    // segment against the transcript's own history.
    let exported: Vec<ChatMessage> = serde_json::from_value(line["messages"].clone()).unwrap();
    let (again, _) = chat_layout(dir, syntax, line)
        .from_messages(&exported, &conversation.tools)
        .unwrap();
    assert_eq!(
        tok.decode(&again).unwrap(),
        tok.decode(&ids).unwrap(),
        "{what}: import"
    );
    let want: Vec<u32> = serde_json::from_value(line["full_ids"].clone()).unwrap();
    let divergence = chat.divergence(&conversation, &ids);
    if ids == want {
        assert_eq!(divergence, None, "{what}");
    } else {
        assert!(
            divergence.is_some(),
            "{what}: ids differ but no difference is named"
        );
    }
    divergence
}

/// Kimi K2 publishes no `tokenizer.json` (a tiktoken model): its template's text, turn by turn.
fn episode_in_text(dir: &Path, line: &Value) -> bool {
    let what = format!("{} {}", line["folder"], line["case"]);
    let syntax = ToolCallSyntax::from_name(line["syntax"].as_str().unwrap()).unwrap();
    let eot = line["end_of_turn"].as_str().unwrap();
    let turns = TurnRenderer::new(
        ChatTemplate::from_folder(dir, true).unwrap(),
        kwargs_of(line),
        eot,
    );
    let messages = line["messages"].as_array().unwrap();
    let tools = line["tools"].as_array().unwrap();
    assert_eq!(
        turns.prompt(&messages[..1], Some(tools)).unwrap(),
        line["prompt"],
        "{what}"
    );
    let assistant: Vec<usize> = (0..messages.len())
        .filter(|&i| messages[i]["role"] == "assistant")
        .collect();
    let mut text = turns.prompt(&messages[..1], Some(tools)).unwrap();
    for (n, &i) in assistant.iter().enumerate() {
        text.push_str(&generated_text(&messages[i], syntax, eot));
        if let Some(&next) = assistant.get(n + 1) {
            let segment = turns
                .segment_after_turn(&messages[..=i], &messages[i + 1..next], Some(tools))
                .unwrap();
            assert_eq!(segment, line["segments"][n], "{what}: segment {n}");
            text.push_str(&segment);
        }
    }
    text == line["full"].as_str().unwrap().trim_end()
}

#[test]
fn released_templates_build_episodes_turn_by_turn_as_transformers_renders_them() {
    let released = released();
    let mut divergent: BTreeMap<String, String> = BTreeMap::new();
    let mut append_only = Vec::new();
    for line in oracle() {
        let folder = line["folder"].as_str().unwrap();
        let name = format!(
            "{folder} {} {}",
            line["case"].as_str().unwrap(),
            line["kwargs"]
        );
        let dir = released.join(folder);
        if line["segments"].is_null() {
            // R1-Distill's template leaves a call turn without the end-of-turn token, and
            // drops calls that come with text: it cannot lay out tool use.
            let syntax = ToolCallSyntax::from_name(line["syntax"].as_str().unwrap()).unwrap();
            let e = ChatFormat::from_folder_with(&dir, syntax, &kwargs_of(&line))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("cannot lay out an episode") && e.contains("does not end with"),
                "{name}: {e}"
            );
            continue;
        }
        if !dir.join("tokenizer.json").is_file() {
            if episode_in_text(&dir, &line) {
                append_only.push(name);
            } else {
                divergent.insert(name, "text".into());
            }
            continue;
        }
        match episode_in_format(&dir, &line) {
            Some(d) => {
                divergent.insert(name, d);
            }
            None => append_only.push(name),
        }
    }
    for (name, d) in &divergent {
        eprintln!("{name}: {d}");
    }
    eprintln!("append-only: {append_only:?}");
    let names: Vec<&str> = divergent.keys().map(String::as_str).collect();
    assert_eq!(
        names, EXPECTED_DIVERGENT,
        "the cases whose templates rewrite history"
    );
}

/// The cases whose template renders the finished conversation otherwise than the episode:
/// Qwen3 writes an empty think block only on the last assistant turn (thinking on: the last
/// turn gets one the model did not write; thinking off: the earlier turns lose the one their
/// generation prompt held), while turns with reasoning after the last query are kept, so the
/// thinking case extends turn by turn; DeepSeek-V3's generation prompt opens `<think>\n`,
/// which its rendering of a call turn leaves out; DeepSeek-V3.1 with thinking renders a call
/// turn as `<think></think>`, dropping the reasoning the model wrote. Qwen3-2507, DeepSeek-V3.1
/// without thinking and Kimi K2 extend turn by turn.
const EXPECTED_DIVERGENT: &[&str] = &[
    "deepseek_v3 calls {}",
    "deepseek_v3 error {}",
    "deepseek_v31 thinking {\"thinking\":true}",
    "qwen3 calls {\"enable_thinking\":false}",
    "qwen3 calls {}",
    "qwen3 error {\"enable_thinking\":false}",
    "qwen3 error {}",
];
