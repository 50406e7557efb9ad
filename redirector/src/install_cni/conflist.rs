//! The cluster network's configuration file, read and written as JSON: which file the
//! container runtime loads, and the edit that chains redirector's entry into it or takes it
//! out again. Pure: the caller reads and writes the files.

use serde_json::{Map, Value};

/// The plugin type of redirector's entry.
pub const PLUGIN_TYPE: &str = "redirector-cni";

/// Set in the entry when a single-plugin file was turned into a list to chain it, naming
/// that file, so that uninstall can put it back as it was.
const CONVERTED_FROM: &str = "convertedFrom";

/// The extensions a container runtime (libcni) loads network configurations from.
const EXTENSIONS: [&str; 3] = [".conf", ".conflist", ".json"];

/// Whether the runtime would load a file of this name.
pub fn is_config_file(name: &str) -> bool {
    !name.starts_with('.') && EXTENSIONS.iter().any(|ext| name.ends_with(ext))
}

/// The file the runtime loads: the lexically first configuration file.
pub fn runtime_pick(names: impl IntoIterator<Item = String>) -> Option<String> {
    names.into_iter().filter(|n| is_config_file(n)).min()
}

/// A file that cannot be edited, and why. The file is left as it is.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{file}: {problem}")]
pub struct ConfError {
    pub file: String,
    pub problem: String,
}

impl ConfError {
    fn new(file: &str, problem: impl Into<String>) -> Self {
        ConfError {
            file: file.to_owned(),
            problem: problem.into(),
        }
    }
}

/// What to do to the directory.
#[derive(Debug, PartialEq)]
pub enum Edit {
    /// The file is already as wanted.
    Unchanged,
    /// Write `contents` as `file`, then remove `replaces` (the file it was made from) if set.
    Write {
        file: String,
        contents: Value,
        replaces: Option<String>,
        what: &'static str,
    },
}

fn parse(file: &str, text: &str) -> Result<Map<String, Value>, ConfError> {
    match serde_json::from_str(text) {
        Ok(Value::Object(conf)) => Ok(conf),
        Ok(_) => Err(ConfError::new(file, "is not a JSON object")),
        Err(err) => Err(ConfError::new(file, format!("is not JSON ({err})"))),
    }
}

/// redirector's entry in `file` (whose content is `text`) as the runtime hands it to the
/// plugin: with the list's `cniVersion` and `name`; `None` when the file has none.
pub fn entry(file: &str, text: &str) -> Result<Option<Value>, ConfError> {
    let conf = parse(file, text)?;
    let Some(Value::Array(plugins)) = conf.get("plugins") else {
        return Ok(None);
    };
    let Some(Value::Object(ours)) = plugins.iter().find(|p| is_ours(p)) else {
        return Ok(None);
    };
    let mut entry = ours.clone();
    for key in ["cniVersion", "name"] {
        if let Some(value) = conf.get(key) {
            entry.entry(key).or_insert_with(|| value.clone());
        }
    }
    Ok(Some(Value::Object(entry)))
}

fn is_ours(plugin: &Value) -> bool {
    plugin.get("type").and_then(Value::as_str) == Some(PLUGIN_TYPE)
}

/// The positions of redirector's entries in a list's plugins.
fn ours(plugins: &[Value]) -> Vec<usize> {
    (0..plugins.len())
        .filter(|&i| is_ours(&plugins[i]))
        .collect()
}

/// The edit that chains `entry` into `file` (whose content is `text`): appended last to
/// `plugins`, or updated in place when an entry is there (never duplicated); a single
/// plugin's file becomes a list of it and the entry. Everything else keeps its content.
pub fn chain(file: &str, text: &str, entry: &Value) -> Result<Edit, ConfError> {
    let mut conf = parse(file, text)?;
    match conf.get("plugins") {
        Some(Value::Array(plugins)) => {
            let mut chained = plugins.clone();
            let positions = ours(plugins);
            match positions.split_first() {
                None => chained.push(entry.clone()),
                Some((&first, duplicates)) => {
                    let mut wanted = entry.clone();
                    if let Some(from) = plugins[first].get(CONVERTED_FROM) {
                        wanted[CONVERTED_FROM] = from.clone();
                    }
                    chained[first] = wanted;
                    for &at in duplicates.iter().rev() {
                        chained.remove(at);
                    }
                }
            }
            if chained == *plugins {
                return Ok(Edit::Unchanged);
            }
            let what = if positions.is_empty() {
                "chained"
            } else {
                "updated"
            };
            conf.insert("plugins".into(), Value::Array(chained));
            Ok(Edit::Write {
                file: file.to_owned(),
                contents: Value::Object(conf),
                replaces: None,
                what,
            })
        }
        Some(_) => Err(ConfError::new(file, "its \"plugins\" is not a list")),
        None if file.ends_with(".conflist") => Err(ConfError::new(file, "has no \"plugins\" list")),
        None => into_list(file, conf, entry),
    }
}

/// A single plugin's configuration turned into a list of that plugin and `entry`, as
/// `<stem>.conflist`: a runtime chains nothing after a `.conf`.
fn into_list(file: &str, mut plugin: Map<String, Value>, entry: &Value) -> Result<Edit, ConfError> {
    if !plugin.get("type").is_some_and(Value::is_string) {
        return Err(ConfError::new(
            file,
            "is neither a plugin list (\"plugins\") nor a plugin (\"type\")",
        ));
    }
    let mut list = Map::new();
    for key in ["cniVersion", "name"] {
        if let Some(value) = plugin.remove(key) {
            list.insert(key.into(), value);
        }
    }
    let mut entry = entry.clone();
    entry[CONVERTED_FROM] = file.into();
    list.insert(
        "plugins".into(),
        Value::Array(vec![Value::Object(plugin), entry]),
    );
    let stem = file.rsplit_once('.').map_or(file, |(stem, _)| stem);
    Ok(Edit::Write {
        file: format!("{stem}.conflist"),
        contents: Value::Object(list),
        replaces: Some(file.to_owned()),
        what: "turned into a list and chained",
    })
}

/// The edit that takes redirector's entries out of `file`; a list that was made from a
/// single plugin's file becomes that file again.
pub fn unchain(file: &str, text: &str) -> Result<Edit, ConfError> {
    let mut conf = parse(file, text)?;
    let Some(Value::Array(plugins)) = conf.get("plugins") else {
        return Ok(Edit::Unchanged);
    };
    let positions = ours(plugins);
    let Some(&first) = positions.first() else {
        return Ok(Edit::Unchanged);
    };
    let converted_from = plugins[first]
        .get(CONVERTED_FROM)
        .and_then(Value::as_str)
        // Only a file beside this one: the name comes from a file others may write.
        .filter(|name| !name.contains('/') && is_config_file(name))
        .map(str::to_owned);
    let rest: Vec<Value> = plugins.iter().filter(|p| !is_ours(p)).cloned().collect();
    if let (Some(original), [Value::Object(plugin)]) = (converted_from, rest.as_slice()) {
        let mut restored = Map::new();
        for key in ["cniVersion", "name"] {
            if let Some(value) = conf.get(key) {
                restored.insert(key.into(), value.clone());
            }
        }
        restored.extend(plugin.clone());
        return Ok(Edit::Write {
            file: original,
            contents: Value::Object(restored),
            replaces: Some(file.to_owned()),
            what: "restored",
        });
    }
    conf.insert("plugins".into(), Value::Array(rest));
    Ok(Edit::Write {
        file: file.to_owned(),
        contents: Value::Object(conf),
        replaces: None,
        what: "unchained",
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Calico's conflist as its installer writes it (cniVersion 0.3.1).
    const CALICO: &str = include_str!("testdata/calico.conflist");

    /// Cilium's `05-cilium.conflist`.
    const CILIUM: &str = include_str!("testdata/cilium.conflist");

    /// flannel's `10-flannel.conflist`.
    const FLANNEL: &str = include_str!("testdata/flannel.conflist");

    /// A single bridge plugin, as `10-bridge.conf`.
    const BRIDGE: &str = include_str!("testdata/bridge.conf");

    /// A conflist on one line, whose last `]` closes an inner array.
    const ONE_LINE: &str = include_str!("testdata/one-line.conflist");

    fn entry() -> Value {
        json!({"type": PLUGIN_TYPE, "args": ["-p", "15001"], "capabilities": {"io.kubernetes.cri.pod-annotations": true}})
    }

    fn written(edit: Edit) -> (String, Value, Option<String>) {
        match edit {
            Edit::Write {
                file,
                contents,
                replaces,
                ..
            } => (file, contents, replaces),
            Edit::Unchanged => panic!("expected a write"),
        }
    }

    #[test]
    fn the_entry_is_chained_last_and_the_rest_kept() {
        for (file, text) in [
            ("10-calico.conflist", CALICO),
            ("05-cilium.conflist", CILIUM),
            ("10-flannel.conflist", FLANNEL),
            ("10-net.conflist", ONE_LINE),
        ] {
            let original: Value = serde_json::from_str(text).unwrap();
            let (name, chained, replaces) = written(chain(file, text, &entry()).unwrap());
            assert_eq!((name.as_str(), replaces), (file, None));
            let plugins = chained["plugins"].as_array().unwrap();
            let before = original["plugins"].as_array().unwrap();
            assert_eq!(plugins.len(), before.len() + 1, "{file}");
            assert_eq!(plugins[..before.len()], before[..], "{file}");
            assert_eq!(plugins.last(), Some(&entry()), "{file}");
            let mut rest = chained.clone();
            rest["plugins"] = original["plugins"].clone();
            assert_eq!(rest, original, "{file}: only plugins changed");
            // The keys keep their order (serde_json's preserve_order).
            let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
            assert_eq!(keys(&chained), keys(&original));
            // Chained again: nothing to do.
            let again = serde_json::to_string(&chained).unwrap();
            assert_eq!(chain(file, &again, &entry()).unwrap(), Edit::Unchanged);
        }
    }

    #[test]
    fn an_entry_already_there_is_updated_in_place_and_never_duplicated() {
        let mut conf: Value = serde_json::from_str(FLANNEL).unwrap();
        let plugins = conf["plugins"].as_array_mut().unwrap();
        plugins.insert(1, json!({"type": PLUGIN_TYPE, "args": ["-p", "1"]}));
        plugins.push(json!({"type": PLUGIN_TYPE}));
        let text = conf.to_string();
        let (_, chained, _) = written(chain("10-flannel.conflist", &text, &entry()).unwrap());
        let plugins = chained["plugins"].as_array().unwrap();
        assert_eq!(plugins.len(), 3);
        assert_eq!(plugins[1], entry(), "updated where it was");
        assert_eq!(plugins[2]["type"], "portmap");
    }

    #[test]
    fn a_single_plugin_becomes_a_list_and_is_restored_on_uninstall() {
        let (name, list, replaces) = written(chain("10-bridge.conf", BRIDGE, &entry()).unwrap());
        assert_eq!(name, "10-bridge.conflist");
        assert_eq!(replaces.as_deref(), Some("10-bridge.conf"));
        assert_eq!(list["cniVersion"], "0.4.0");
        assert_eq!(list["name"], "bridge");
        assert_eq!(list["plugins"][0]["type"], "bridge");
        assert!(list["plugins"][0].get("cniVersion").is_none());
        assert_eq!(list["plugins"][1]["type"], PLUGIN_TYPE);
        let text = list.to_string();
        assert_eq!(
            chain(&name, &text, &entry()).unwrap(),
            Edit::Unchanged,
            "the entry's origin is kept when it is checked again"
        );
        let (back, restored, replaces) = written(unchain(&name, &text).unwrap());
        assert_eq!(back, "10-bridge.conf");
        assert_eq!(replaces.as_deref(), Some("10-bridge.conflist"));
        assert_eq!(restored, serde_json::from_str::<Value>(BRIDGE).unwrap());
    }

    #[test]
    fn uninstall_takes_out_every_entry_and_keeps_the_rest() {
        let (_, chained, _) = written(chain("10-calico.conflist", CALICO, &entry()).unwrap());
        let (file, unchained, replaces) =
            written(unchain("10-calico.conflist", &chained.to_string()).unwrap());
        assert_eq!((file.as_str(), replaces), ("10-calico.conflist", None));
        assert_eq!(unchained, serde_json::from_str::<Value>(CALICO).unwrap());
        assert_eq!(
            unchain("10-calico.conflist", CALICO).unwrap(),
            Edit::Unchanged
        );
        assert_eq!(unchain("10-bridge.conf", BRIDGE).unwrap(), Edit::Unchanged);
    }

    #[test]
    fn a_restored_name_must_be_a_file_beside_it() {
        let conf = json!({"cniVersion": "1.0.0", "name": "n", "plugins": [
            {"type": "bridge"},
            {"type": PLUGIN_TYPE, CONVERTED_FROM: "../../etc/passwd.conf"}
        ]});
        let (file, contents, replaces) =
            written(unchain("10-x.conflist", &conf.to_string()).unwrap());
        assert_eq!((file.as_str(), replaces), ("10-x.conflist", None));
        assert_eq!(contents["plugins"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn files_that_cannot_be_chained_are_errors_naming_them() {
        let cases = [
            ("10-a.conflist", "{\"plugins\": [", "is not JSON"),
            ("10-a.conflist", "[]", "not a JSON object"),
            (
                "10-a.conflist",
                r#"{"cniVersion":"1.0.0","name":"a"}"#,
                "no \"plugins\" list",
            ),
            ("10-a.conflist", r#"{"plugins":{}}"#, "not a list"),
            (
                "10-a.conf",
                r#"{"cniVersion":"1.0.0","name":"a"}"#,
                "neither a plugin list",
            ),
        ];
        for (file, text, problem) in cases {
            let err = chain(file, text, &entry()).unwrap_err();
            assert_eq!(err.file, file);
            assert!(err.to_string().contains(problem), "{err}");
        }
    }

    #[test]
    fn the_runtime_loads_the_lexically_first_configuration_file() {
        let names = [
            "99-z.conflist",
            "README",
            "10-b.json",
            ".10-a.conf.tmp",
            "00-multus.conf",
        ];
        assert_eq!(
            runtime_pick(names.map(String::from)).as_deref(),
            Some("00-multus.conf")
        );
        assert_eq!(runtime_pick(["notes.txt".to_string()]), None);
        // A .conf sorts before the .conflist made from it.
        assert_eq!(
            runtime_pick(["10-bridge.conflist", "10-bridge.conf"].map(String::from)).as_deref(),
            Some("10-bridge.conf")
        );
    }
}
