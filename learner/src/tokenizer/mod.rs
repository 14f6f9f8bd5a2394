//! Byte-level tokenizer and chat template (see the model issue).
