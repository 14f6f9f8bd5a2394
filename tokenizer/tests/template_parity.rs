//! Chat templates rendered by Corvid against transformers' `apply_chat_template`, on the
//! fixtures `scripts/tokenizer_fixtures.py` writes (`tests/fixtures/<template>/`): the same text
//! and, through the folder's `tokenizer.json`, the same token ids, for conversations with and
//! without tools, tool calls and results, reasoning and several turns; the template's own
//! refusals (`raise_exception`) come back as errors naming the template and its message.

use std::path::{Path, PathBuf};

use corvid_tokenizer::{special_tokens, ChatInput, ChatTemplate, HfTokenizer};
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

#[test]
fn templates_render_the_text_and_ids_transformers_renders() {
    let mut checked = 0;
    for name in ["chatml_tools", "bos_eos"] {
        let dir = fixture(name);
        let tok = HfTokenizer::from_file(&dir.join("tokenizer.json")).unwrap();
        let expected: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap())
                .unwrap();
        for case in expected["cases"].as_array().unwrap() {
            let what = format!("{name} / {}", case["name"]);
            let tools = case["tools"].as_array().map(Vec::as_slice);
            let template = ChatTemplate::from_folder(&dir, tools.is_some()).unwrap();
            let mut extra = special_tokens(&dir).unwrap();
            for (k, v) in case["kwargs"].as_object().unwrap() {
                extra.insert(k.clone(), v.clone());
            }
            let input = ChatInput {
                messages: case["messages"].as_array().unwrap(),
                tools,
                add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
                extra,
            };
            match (template.render(&input), case.get("error")) {
                (Ok(text), None) => {
                    assert_eq!(text, case["text"].as_str().unwrap(), "{what}");
                    let ids: Vec<u64> = tok
                        .encode(&text)
                        .unwrap()
                        .into_iter()
                        .map(u64::from)
                        .collect();
                    let want: Vec<u64> = case["ids"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|v| v.as_u64().unwrap())
                        .collect();
                    assert_eq!(ids, want, "{what}");
                }
                (Err(e), Some(want)) => {
                    let msg = e.to_string();
                    assert!(
                        msg.contains(want.as_str().unwrap()) && msg.contains("chat_template.jinja"),
                        "{what}: {msg}"
                    );
                }
                (got, want) => panic!("{what}: rendered {got:?}, expected error {want:?}"),
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 9);
}

#[test]
fn a_folder_without_a_template_or_with_a_broken_one_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("tokenizer_config.json"),
        "{\"eos_token\": \"</s>\"}",
    )
    .unwrap();
    let e = ChatTemplate::from_folder(tmp.path(), false)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("tokenizer_config.json") && e.contains("no chat_template"),
        "{e}"
    );
    std::fs::write(
        tmp.path().join("chat_template.jinja"),
        "{% for m in messages %}\n{{ m.content }\n{% endfor %}",
    )
    .unwrap();
    let e = ChatTemplate::from_folder(tmp.path(), false)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("chat_template.jinja") && e.contains("line 2"),
        "{e}"
    );
    std::fs::write(tmp.path().join("tokenizer_config.json"), "{not json").unwrap();
    let e = special_tokens(tmp.path()).unwrap_err().to_string();
    assert!(
        e.contains("tokenizer_config.json") && e.contains("not valid JSON"),
        "{e}"
    );
}
