//! Task packs: data-defined task families in TOML (`tasks/packs/*.toml`).
//!
//! A pack declares template variables, the tools it allows, its levels, a prompt and
//! initial files (templated with `{var}`), a checker, process-reward rules and an oracle
//! plan. `docs/tasks.md` documents the format; [`load_pack`] parses and validates one,
//! reporting every error with `file:line:column` and what to write instead.
//!
//! - `mod.rs`: [`TaskPack`] and [`load_pack`]: parsing, the list of rules validation runs,
//!   and the [`TaskFamily`] impl that draws an instance;
//! - `schema.rs`: the TOML schema, the `Raw*` structs a pack file is read into;
//! - `diag.rs`: [`PackDiagnostic`], and locating a problem at a line and column;
//! - `template.rs`: `{var}` placeholders, rendering, and the assignments of the variables
//!   that validation renders templates with;
//! - `paths.rs`: the rules for the workspace paths a pack names (`[files]`, `file_state`),
//!   shared by instances and validation;
//! - `checks.rs`: the validation rules, one function each.

mod checks;
mod diag;
mod paths;
mod schema;
mod template;

use corvid_proto::ToolStatus;
use std::collections::BTreeMap;
use std::path::Path;

pub use self::diag::PackDiagnostic;
use self::diag::{toml_error_hint, Diags};
use self::paths::{render_paths, FILES, FILE_STATE};
use self::schema::{RawLevel, RawPack};
use self::template::{render, render_value};
use crate::checker::Checker;
use crate::error::TasksError;
use crate::families::PlanBuilder;
use crate::process::ProcessRule;
use crate::rng::SplitMix64;
use crate::task::{
    check_level, CustomToolDecl, OraclePlan, ReadOnlyData, TaskFamily, TaskInstance, ToolSpec,
};

/// A parsed, validated task pack; a [`TaskFamily`].
#[derive(Debug, Clone)]
pub struct TaskPack {
    file: String,
    raw: RawPack,
}

impl TaskPack {
    /// Parses and validates pack text; `file` names it in diagnostics.
    pub fn parse(file: &str, src: &str) -> Result<Self, TasksError> {
        let mut d = Diags {
            file,
            src,
            out: Vec::new(),
        };
        let raw: RawPack = match toml::from_str(src) {
            Ok(r) => r,
            Err(e) => {
                let msg = e.message().trim().to_string();
                let hint = toml_error_hint(&msg);
                d.push(e.span().unwrap_or(0..0), msg, hint);
                return Err(TasksError::Pack(d.out));
            }
        };
        Self::validate(&mut d, &raw);
        d.out.sort_by_key(|e| (e.line, e.column));
        if d.out.is_empty() {
            Ok(Self {
                file: file.to_string(),
                raw,
            })
        } else {
            Err(TasksError::Pack(d.out))
        }
    }

    /// The rules a pack must follow, in the order their diagnostics are found (they are
    /// then sorted by position; ties keep this order).
    fn validate(d: &mut Diags<'_>, raw: &RawPack) {
        checks::pack_name(d, raw);
        checks::python_runtime(d, raw);
        checks::variables(d, raw);
        checks::tools_exist(d, raw);
        checks::custom_tools(d, raw);
        checks::answer_allowed(d, raw);
        checks::levels(d, raw);
        checks::template_variables(d, raw);
        checks::checker(d, raw);
        checks::file_paths(d, raw);
        checks::process_rewards(d, raw);
        checks::oracle_calls(d, raw);
    }

    /// The pack's file, as given to [`TaskPack::parse`].
    pub fn file(&self) -> &str {
        &self.file
    }
}

/// The folder of the pack file `file`, which the module paths it names are relative to.
fn pack_dir(file: &str) -> &Path {
    Path::new(file).parent().unwrap_or(Path::new(""))
}

/// Reads and validates the pack at `path`.
pub fn load_pack(path: &std::path::Path) -> Result<TaskPack, TasksError> {
    let src = std::fs::read_to_string(path).map_err(|e| TasksError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    TaskPack::parse(&path.display().to_string(), &src)
}

impl TaskFamily for TaskPack {
    fn name(&self) -> &str {
        self.raw.pack.name.get_ref()
    }

    fn description(&self) -> &str {
        &self.raw.pack.description
    }

    fn levels(&self) -> u32 {
        self.raw.levels.get_ref().len() as u32
    }

    fn instance(&self, level: u32, seed: u64) -> Result<TaskInstance, TasksError> {
        check_level(self.name(), level, self.levels())?;
        let lv = self.raw.levels.get_ref()[level as usize - 1].get_ref();
        let vars = self.draw_vars(lv, level, seed);
        let id = format!("{}/L{level}/s{seed}", self.name());
        // Errors that only some values cause (validation cannot try every combination).
        let refused = |message: String| TasksError::PackInstance {
            file: self.file.clone(),
            instance: id.clone(),
            vars: vars
                .iter()
                .map(|(n, v)| format!("{n} = {v:?}"))
                .collect::<Vec<_>>()
                .join(", "),
            message,
        };
        let files = render_paths(
            &FILES,
            self.raw
                .files
                .iter()
                .map(|(p, c)| (p.get_ref().clone(), render(c.get_ref(), &vars).into_bytes())),
            &vars,
        )
        .map_err(refused)?;
        let checker = self.checker(&vars, refused)?;
        let process_rules = self.process_rules(&vars)?;
        let oracle = self.oracle(&files, &vars);
        let inst = TaskInstance {
            id,
            family: self.name().to_string(),
            level,
            seed,
            prompt: render(self.raw.prompt.get_ref(), &vars),
            files,
            read_only: ReadOnlyData::default(),
            tools: self.tool_specs(),
            max_turns: *lv.max_turns.get_ref(),
            context_budget: *lv.context_budget.get_ref(),
            checker,
            process_rules,
            oracle,
            custom_tools: self.custom_tool_decls(),
            python: self
                .raw
                .pack
                .python
                .as_ref()
                .and_then(|n| corvid_sandbox::PythonFlavor::from_name(n.get_ref()))
                .unwrap_or_default(),
            spec_hash: String::new(),
        };
        Ok(inst.seal())
    }
}

/// The parts of an instance, drawn or rendered for one level and seed.
impl TaskPack {
    /// The values of the variables for level `level` (spec `lv`, whose overrides replace
    /// `[vars]`) and `seed`, drawn in the order of their names.
    fn draw_vars(&self, lv: &RawLevel, level: u32, seed: u64) -> BTreeMap<String, String> {
        let mut rng = SplitMix64::derive(seed, &format!("pack/{}/{level}", self.name()));
        let mut vars = BTreeMap::new();
        for (n, v) in &self.raw.vars {
            let v = lv.vars.get(n).unwrap_or(v).get_ref();
            let x = match (&v.choices, v.min, v.max) {
                (Some(c), _, _) => rng.pick(c).clone(),
                (None, Some(lo), Some(hi)) => rng.range(lo, hi).to_string(),
                _ => String::new(),
            };
            vars.insert(n.clone(), x);
        }
        vars
    }

    /// A part `what` of the pack that does not parse once rendered with an instance's values.
    fn invalid(&self, what: &str, e: toml::de::Error) -> TasksError {
        TasksError::InvalidConfig {
            field: format!("{}.{what}", self.name()),
            value: e.message().to_string(),
            expected: "a value that validates".into(),
        }
    }

    /// The checker rendered with `vars`, its `file_state` paths rendered too and its WASI
    /// module located; `refused` makes the error for values it cannot judge with.
    fn checker(
        &self,
        vars: &BTreeMap<String, String>,
        refused: impl Fn(String) -> TasksError,
    ) -> Result<Checker, TasksError> {
        let mut checker: Checker = render_value(self.raw.checker.get_ref(), vars)
            .try_into()
            .map_err(|e| self.invalid("checker", e))?;
        // A checker that cannot judge (a regex that does not compile with this instance's
        // values, a command the shell does not have, a path no workspace holds) is a
        // broken instance, not a failed episode.
        checker.validate().map_err(|e| refused(e.to_string()))?;
        if let Checker::FileState { files } = &mut checker {
            // `render_value` renders values only; the paths are the table's keys.
            *files = render_paths(&FILE_STATE, std::mem::take(files), vars).map_err(&refused)?;
        }
        if let Checker::Wasi { module, .. } = &mut checker {
            // The module path is written relative to the pack file.
            *module = pack_dir(&self.file).join(&*module).display().to_string();
        }
        if let Checker::Python {
            script: Some(script),
            ..
        } = &mut checker
        {
            *script = pack_dir(&self.file).join(&*script).display().to_string();
        }
        Ok(checker)
    }

    /// The process rewards, rendered with `vars`.
    fn process_rules(
        &self,
        vars: &BTreeMap<String, String>,
    ) -> Result<Vec<ProcessRule>, TasksError> {
        self.raw
            .process_rewards
            .iter()
            .map(|r| {
                let rule = render_value(r.get_ref(), vars)
                    .try_into::<ProcessRule>()
                    .map_err(|e| self.invalid("process_rewards", e))?;
                rule.validate()?;
                Ok(rule)
            })
            .collect()
    }

    /// The oracle plan over the initial `files`, its arguments and answer rendered with
    /// `vars`; calls of custom tools are external steps (the simulator cannot run them).
    fn oracle(
        &self,
        files: &BTreeMap<String, Vec<u8>>,
        vars: &BTreeMap<String, String>,
    ) -> OraclePlan {
        let oracle = self.raw.oracle.get_ref();
        let mut plan = PlanBuilder::new(files, &[]);
        for c in &oracle.calls {
            let args = toml::Value::Table(c.get_ref().args.clone());
            let json = serde_json::to_value(render_value(&args, vars)).unwrap_or_default();
            let tool = c.get_ref().tool.get_ref();
            if self.raw.custom_tools.contains_key(tool) || tool == "python" {
                plan.external(tool, json, ToolStatus::Ok, String::new());
            } else {
                plan.call(tool, json);
            }
        }
        OraclePlan {
            steps: plan.finish(),
            answer: render(oracle.answer.get_ref(), vars),
        }
    }

    /// The tools `[tools]` allows, with their limits.
    fn tool_specs(&self) -> Vec<ToolSpec> {
        self.raw
            .tools
            .get_ref()
            .iter()
            .map(|(n, l)| ToolSpec {
                name: n.clone(),
                limits: l.get_ref().clone(),
            })
            .collect()
    }

    /// The `[custom_tools]`, their modules located relative to the pack file.
    fn custom_tool_decls(&self) -> Vec<CustomToolDecl> {
        self.raw
            .custom_tools
            .iter()
            .map(|(n, c)| {
                let c = c.get_ref();
                CustomToolDecl {
                    name: n.clone(),
                    description: c.description.get_ref().clone(),
                    module: pack_dir(&self.file)
                        .join(c.module.get_ref())
                        .display()
                        .to_string(),
                    limits: c.limits(),
                    workspace_writable: c.workspace_writable,
                }
            })
            .collect()
    }
}
