//! The workspace paths of a pack: the `[files]` paths and a `file_state` checker's, both
//! templates rendered with an instance's variables.
//!
//! Both must render to paths the sandbox accepts and must not [`Clash`]; [`render_paths`]
//! applies these rules to one instance, and the path checks in `checks.rs` apply the same
//! rules, through [`Clash::find`] and [`workspace_path_problem`], to every assignment
//! validation tries, so that a pack is refused before any instance is drawn.

use std::collections::BTreeMap;
use std::ops::Range;

use super::diag::narrow;
use super::schema::RawPack;
use super::template::render;

/// Why the sandbox would refuse `p` as a path of a workspace's initial files, if it would.
pub(super) fn workspace_path_problem(p: &str) -> Option<&'static str> {
    corvid_sandbox::check_rel_path(p).err()
}

/// `p` made into a path the sandbox accepts, for a hint: forbidden characters and empty,
/// `.` and `..` components dropped.
pub(super) fn clean_workspace_path(p: &str) -> String {
    let p: String = p
        .chars()
        .filter(|&c| !corvid_sandbox::forbidden_char(c))
        .collect();
    let clean = p
        .split('/')
        .filter(|c| !c.is_empty() && *c != "." && *c != "..")
        .collect::<Vec<_>>()
        .join("/");
    if clean.is_empty() {
        "notes.txt".to_string()
    } else {
        clean
    }
}

/// How errors name the keys of one map of workspace paths of a pack: the `[files]` paths,
/// or a `file_state` checker's. Both are templates rendered with the instance's variables;
/// both must render to paths the sandbox accepts, and to distinct ones (a map holds one
/// value per path: another key rendered to it would be lost); `[files]` paths also to
/// paths none of which is a folder of another (see [`Clash`]).
pub(super) struct PathKeys {
    /// One key, as errors name it: `[files] path`.
    pub(super) one: &'static str,
    /// Two keys: `[files] paths`.
    pub(super) two: &'static str,
    /// What happens to an instance with an invalid key.
    pub(super) refused: &'static str,
    /// Whether `instance()` refuses an invalid rendered key itself (the sandbox refuses an
    /// invalid `[files]` path by name when the episode starts; no workspace checks a
    /// checker's).
    instance_checks: bool,
    /// What two keys rendered to one path would lose.
    lost: &'static str,
    /// Whether a key rendered to a folder of another's path is an error (files need their
    /// folders; expectations do not: `a` may be expected absent beside `a/b`).
    nested: bool,
}

/// The `[files]` paths.
pub(super) const FILES: PathKeys = PathKeys {
    one: "[files] path",
    two: "[files] paths",
    refused: "the sandbox refuses it",
    instance_checks: false,
    lost: "one file's content would replace the other's",
    nested: true,
};

/// A `file_state` checker's paths.
pub(super) const FILE_STATE: PathKeys = PathKeys {
    one: "checker file_state key",
    two: "checker file_state keys",
    refused: "instances refuse it (no workspace holds such a path)",
    instance_checks: true,
    lost: "one expectation would replace the other",
    nested: false,
};

/// Why two rendered paths of one map of workspace paths cannot both be in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Clash {
    /// Both are this path.
    Same(String),
    /// The two paths, in the order compared, one of which is a folder of the other: the
    /// sandbox would have to create it as a file and as a folder at once, and cannot create
    /// the workspace (`a.txt` and `a.txt/b.txt`).
    Nested([String; 2]),
}

impl Clash {
    /// How the rendered paths `a` and `b` of `keys` clash, if they do. Paths are compared by
    /// their components: a path the sandbox accepts has nothing to normalise (no leading
    /// '/', no empty, `.` or `..` component; [`workspace_path_problem`]), and one it refuses
    /// is reported on its own, so it is compared only as written, for equality.
    pub(super) fn find(keys: &PathKeys, a: &str, b: &str) -> Option<Self> {
        if a == b {
            return Some(Self::Same(a.to_string()));
        }
        if !keys.nested
            || workspace_path_problem(a).is_some()
            || workspace_path_problem(b).is_some()
        {
            return None;
        }
        let (ca, cb): (Vec<&str>, Vec<&str>) = (a.split('/').collect(), b.split('/').collect());
        (cb.starts_with(&ca) || ca.starts_with(&cb))
            .then(|| Self::Nested([a.to_string(), b.to_string()]))
    }

    /// What the two templates render to: `both render to "p"`, or
    /// `render to "a.txt" and "a.txt/b.txt"`.
    pub(super) fn rendered(&self) -> String {
        match self {
            Self::Same(p) => format!("both render to {p:?}"),
            Self::Nested([a, b]) => format!("render to {a:?} and {b:?}"),
        }
    }

    /// What the clash breaks.
    pub(super) fn consequence(&self, keys: &PathKeys) -> String {
        match self {
            Self::Same(_) => keys.lost.to_string(),
            Self::Nested(paths) => {
                let [folder, file] = if paths[0].len() < paths[1].len() {
                    [&paths[0], &paths[1]]
                } else {
                    [&paths[1], &paths[0]]
                };
                format!(
                    "{folder:?} would be both a file and the folder of {file:?}, which the sandbox cannot create"
                )
            }
        }
    }
}

/// Renders the path templates of `entries` with `vars`, keeping each value. A rendered
/// path the sandbox refuses (where `keys.instance_checks`) and two templates whose
/// renderings [`Clash`] are errors naming the templates and what they rendered to.
pub(super) fn render_paths<V>(
    keys: &PathKeys,
    entries: impl IntoIterator<Item = (String, V)>,
    vars: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, V>, String> {
    let mut out = BTreeMap::new();
    // (template, rendering) of the entries so far.
    let mut seen: Vec<(String, String)> = Vec::new();
    for (t, v) in entries {
        let p = render(&t, vars);
        if let Some(why) = workspace_path_problem(&p).filter(|_| keys.instance_checks) {
            return Err(format!(
                "{} {t:?} renders to {p:?}, which is not a valid workspace path: {why}",
                keys.one
            ));
        }
        for (first, q) in &seen {
            if let Some(clash) = Clash::find(keys, q, &p) {
                return Err(format!(
                    "{} {first:?} and {t:?} {}; {}",
                    keys.two,
                    clash.rendered(),
                    clash.consequence(keys)
                ));
            }
        }
        seen.push((t, p.clone()));
        out.insert(p, v);
    }
    Ok(out)
}

/// The keys of the checker's `files` table (a `file_state` checker's paths), each located
/// at its first occurrence in the checker's table (written in quotes, or bare), in file
/// order.
pub(super) fn checker_file_keys(src: &str, raw: &RawPack) -> Vec<(Range<usize>, String)> {
    let span = raw.checker.span();
    let Some(files) = raw.checker_field("files").and_then(|f| f.as_table()) else {
        return Vec::new();
    };
    let mut keys: Vec<(Range<usize>, String)> = files
        .keys()
        .map(|k| {
            let quoted = narrow(src, &span, &format!("{k:?}"));
            let at = if quoted != span {
                quoted
            } else {
                narrow(src, &span, k)
            };
            (at, k.clone())
        })
        .collect();
    keys.sort_by_key(|(at, _)| at.start);
    keys
}

/// The `[files]` paths, each located at its key, in file order.
pub(super) fn file_keys(raw: &RawPack) -> Vec<(Range<usize>, String)> {
    let mut paths: Vec<(Range<usize>, String)> = raw
        .files
        .keys()
        .map(|p| (p.span(), p.get_ref().clone()))
        .collect();
    paths.sort_by_key(|(at, _)| at.start);
    paths
}
