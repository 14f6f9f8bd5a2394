//! Reading a Hugging Face `config.json` key by key: each architecture takes the keys it
//! implements (with transformers' default where the key may be absent), checks the keys whose
//! only supported value is one value, names the keys that carry no weight in the forward
//! (metadata), and [`Keys::finish`] refuses whatever is left, naming the key and its value. No
//! key is ever dropped unread.

use std::path::Path;

use serde_json::{Map, Value};

use crate::ModelError;

/// The keys of one config object not yet taken.
pub(crate) struct Keys {
    file: String,
    /// Prefix for nested objects (`rope_parameters.`), empty at the top.
    prefix: String,
    map: Map<String, Value>,
}

impl Keys {
    /// The top-level object of the config file at `path`, whose text is `text`.
    pub(crate) fn parse(path: &Path, text: &str) -> Result<Self, ModelError> {
        let file = path.display().to_string();
        let value: Value = serde_json::from_str(text).map_err(|e| ModelError::HfConfig {
            file: file.clone(),
            key: "<file>".into(),
            problem: format!("not valid JSON: {e}"),
        })?;
        let Value::Object(map) = value else {
            return Err(ModelError::HfConfig {
                file,
                key: "<file>".into(),
                problem: "the config is not a JSON object".into(),
            });
        };
        Ok(Keys {
            file,
            prefix: String::new(),
            map,
        })
    }

    /// An error about `key` of this object.
    pub(crate) fn error(&self, key: &str, problem: impl Into<String>) -> ModelError {
        ModelError::HfConfig {
            file: self.file.clone(),
            key: format!("{}{key}", self.prefix),
            problem: problem.into(),
        }
    }

    /// Takes `key` if present and not null.
    fn take(&mut self, key: &str) -> Option<Value> {
        self.map.remove(key).filter(|v| !v.is_null())
    }

    /// A list of integers (e.g. `mlp_only_layers`); absent or null is empty.
    pub(crate) fn i64_list(&mut self, key: &str) -> Result<Vec<i64>, ModelError> {
        match self.take(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_i64()
                        .ok_or_else(|| self.error(key, format!("expected integers, got {v}")))
                })
                .collect(),
            Some(v) => Err(self.error(key, format!("expected a list of integers, got {v}"))),
        }
    }

    /// A list of strings (e.g. `layer_types`); absent or null is empty.
    pub(crate) fn str_list(&mut self, key: &str) -> Result<Vec<String>, ModelError> {
        match self.take(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| self.error(key, format!("expected strings, got {v}")))
                })
                .collect(),
            Some(v) => Err(self.error(key, format!("expected a list of strings, got {v}"))),
        }
    }

    /// Takes every key left, e.g. for a config that serde reads whole.
    pub(crate) fn take_all(&mut self) -> Map<String, Value> {
        std::mem::take(&mut self.map)
    }

    /// The config file's path, for errors that do not concern one key.
    pub(crate) fn file(&self) -> &str {
        &self.file
    }

    /// Whether `key` is present with the value null.
    pub(crate) fn is_null(&self, key: &str) -> bool {
        self.map.get(key).is_some_and(Value::is_null)
    }

    /// An integer key, or `default` when absent.
    pub(crate) fn i64_or(&mut self, key: &str, default: i64) -> Result<i64, ModelError> {
        Ok(self.opt_i64(key)?.unwrap_or(default))
    }

    /// An integer key that may be absent or null.
    pub(crate) fn opt_i64(&mut self, key: &str) -> Result<Option<i64>, ModelError> {
        match self.take(key) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .map(Some)
                .ok_or_else(|| self.error(key, format!("expected an integer, got {v}"))),
        }
    }

    /// A number key, or `default` when absent.
    pub(crate) fn f64_or(&mut self, key: &str, default: f64) -> Result<f64, ModelError> {
        Ok(self.opt_f64(key)?.unwrap_or(default))
    }

    /// A number key that may be absent or null.
    pub(crate) fn opt_f64(&mut self, key: &str) -> Result<Option<f64>, ModelError> {
        match self.take(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.error(key, format!("expected a number, got {v}"))),
        }
    }

    /// A boolean key, or `default` when absent.
    pub(crate) fn bool_or(&mut self, key: &str, default: bool) -> Result<bool, ModelError> {
        match self.take(key) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| self.error(key, format!("expected true or false, got {v}"))),
        }
    }

    /// A string key, or `default` when absent.
    pub(crate) fn str_or(&mut self, key: &str, default: &str) -> Result<String, ModelError> {
        match self.take(key) {
            None => Ok(default.to_string()),
            Some(Value::String(s)) => Ok(s),
            Some(v) => Err(self.error(key, format!("expected a string, got {v}"))),
        }
    }

    /// A key Corvid supports with one value only (e.g. `hidden_act = "silu"`): absent or equal
    /// to `supported` passes; anything else is refused with `why`.
    pub(crate) fn only(
        &mut self,
        key: &str,
        supported: Value,
        why: &str,
    ) -> Result<(), ModelError> {
        match self.take(key) {
            None => Ok(()),
            Some(v) if v == supported || numbers_equal(&v, &supported) => Ok(()),
            Some(v) => Err(self.error(
                key,
                format!("{v} is not supported (Corvid implements {supported}: {why})"),
            )),
        }
    }

    /// A nested object (e.g. `rope_parameters`), if present and not null.
    pub(crate) fn object(&mut self, key: &str) -> Result<Option<Keys>, ModelError> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::Object(map)) => Ok(Some(Keys {
                file: self.file.clone(),
                prefix: format!("{}{key}.", self.prefix),
                map,
            })),
            Some(v) => Err(self.error(key, format!("expected an object, got {v}"))),
        }
    }

    /// Takes the keys that do not change the network's function (names, dtypes, token ids,
    /// cache and parallelism settings, training-only coefficients): they are read and set
    /// aside, never used by the forward.
    pub(crate) fn metadata(&mut self, keys: &[&str]) {
        for key in keys {
            self.map.remove(*key);
        }
    }

    /// Refuses whatever key is left: Corvid does not implement it.
    pub(crate) fn finish(self) -> Result<(), ModelError> {
        match self.map.iter().next() {
            None => Ok(()),
            Some((key, value)) => Err(self.error(
                key,
                format!(
                    "{value} is a key Corvid does not implement for this architecture \
                     (the supported keys are listed in model/src/arch/<family>/README.md)"
                ),
            )),
        }
    }
}

/// `1` and `1.0` are the same config value.
fn numbers_equal(a: &Value, b: &Value) -> bool {
    matches!((a.as_f64(), b.as_f64()), (Some(x), Some(y)) if x == y)
}

/// The keys every `PretrainedConfig` writes that do not change the forward.
pub(crate) const COMMON_METADATA: &[&str] = &[
    "architectures",
    "model_type",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "_name_or_path",
    "auto_map",
    "use_cache",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "id2label",
    "label2id",
    "problem_type",
    "tokenizer_class",
    "chunk_size_feed_forward",
    "is_encoder_decoder",
    "pretraining_tp",
];
