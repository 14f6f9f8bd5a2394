//! corvid-episode: how an episode becomes exact token ids. The actor generates with it, the
//! trainers learn from it, and `corvid eval` / `corvid replay` read stored episodes back
//! with it, so this is the one place the layout is written down.
//!
//! # Brief overview
//!
//! - [`EpisodeFormat`] ([`format`](mod@format)): the token layout of each turn (the prompt,
//!   a tool result, a call), where generation stops, how a generated turn parses into a
//!   [`ToolCall`](corvid_proto::ToolCall) ([`CallParseError`] when it does not), and every
//!   special id a consumer needs: the pad id the packer fills with, the call marker the
//!   evaluator counts, the tool-result span `replay` shows. Nobody else reads the
//!   tokenizer's specials.
//! - [`ChatFormat`] ([`chat_format`]): the same operations for a Hugging Face model, in its
//!   own tokenizer, chat template and tool-call syntax, token-in-token-out: the generated ids
//!   are kept as sampled, and each segment after a turn is cut from the template's rendering
//!   of the episode's real [`Conversation`] at the end of that turn, never re-rendering
//!   history; where a template rewrites history (Qwen3), the difference is named
//!   ([`ChatFormat::notes`], [`ChatFormat::divergence`]), never an error. An `EpisodeFormat`
//!   holds one for a run in the model's own format ([`EpisodeFormat::for_model_folder`]), and
//!   its [`FormatDescription`] (tokenizer hash, syntax, template keywords) is what actors must
//!   match.
//! - [`ToolCallSyntax`] ([`tool_syntax`]): the tool-call text of each model family (Hermes /
//!   Qwen3, DeepSeek-V3 and R1, DeepSeek-V3.1, Kimi K2, Corvid's own), written and read back.
//! - [`transcript`]: the [`Conversation`] an episode is built from, an episode read back as an
//!   OpenAI-style chat ([`ChatMessage`]) and a chat laid out as an episode's exact tokens
//!   (`replay export --format chat`, SFT imports).
//! - [`fold`](mod@fold): the context a new segment opens with when an episode outgrows its
//!   window (context folding): the prompt, the carried memory and the recent turns.
//! - [`demonstration`]: a task's oracle plan run in the real sandbox and laid out in the
//!   format ([`oracle_steps`]), with [`Mistakes`] injected to teach recovery; the process
//!   reward of a malformed turn ([`invalid_call_reward`]).
//!
//! ```
//! use corvid_episode::EpisodeFormat;
//! let format = EpisodeFormat::default();
//! let call = format.call_ids("read_file", &serde_json::json!({"path": "a.txt"})).unwrap();
//! let parsed = format.parse_call(&call).unwrap();
//! assert_eq!(parsed.name, "read_file");
//! assert_eq!(parsed.arguments_json, r#"{"path":"a.txt"}"#);
//! // The tool's answer closes the assistant turn and opens the next one.
//! let mut conversation = corvid_episode::Conversation::default();
//! let next = format.result_ids(&mut conversation, &call, "hello").unwrap();
//! assert_eq!(format.decode(&next), "<|end|><|tool|>hello<|end|><|assistant|>");
//! ```
#![deny(missing_docs)]

pub mod chat_format;
pub mod demonstration;
pub mod fold;
pub mod format;
pub mod tool_syntax;
pub mod transcript;

pub use chat_format::{read_template_kwargs, ChatFormat, KWARGS_FILE, TOKENIZER_FILES};
pub use demonstration::{
    invalid_call_reward, oracle_steps, oracle_steps_folded, oracle_steps_with, Demonstration,
    DemonstrationError, Mistakes,
};
pub use fold::{FoldedTurn, Segment};
pub use format::{CallParseError, EpisodeFormat, FormatDescription, FormatError, ToolPrompt};
pub use tool_syntax::ToolCallSyntax;
pub use transcript::{ChatFunction, ChatMessage, ChatToolCall, Conversation, TranscriptError};
