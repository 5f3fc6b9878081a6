//! The pod-field guard: every field of `v1.Pod` is handled (with a test showing its effect),
//! refused (with the message the pod gets), or not the kubelet's to act on (the scheduler's,
//! the apiserver's). Values the node agent does not provide are refused at admission
//! ([`refuse`]); the table of all fields is [`table::TABLE`], and `docs/pod-fields.md` is
//! generated from both.

pub mod refuse;
pub mod table;
pub mod walk;

pub use refuse::refusal;

/// What the kubelet does with one field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Acted on as upstream does; the named test shows the effect.
    Handled(&'static str),
    /// Not provided: the pod gets this message. The named test shows it; an empty name means
    /// the refusal is at admission ([`refuse::REFUSALS`] holds an entry with this message).
    Refused(&'static str, &'static str),
    /// Not the kubelet's to act on (as upstream's kubelet): who reads it.
    Elsewhere(&'static str),
    /// Not acted on yet, and nothing to refuse when the pod is created: what happens today.
    NotYet(&'static str),
}

/// One field of one schema type.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    pub owner: &'static str,
    pub field: &'static str,
    pub fate: Fate,
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|")
}

/// `docs/pod-fields.md`.
pub fn pod_fields_doc() -> String {
    let mut s = String::from(
        "# Pod fields\n\n\
         <!-- Generated from kubelet/src/pod/admission/fields/; do not edit.\n\
         Regenerate: UPDATE_POD_FIELDS_DOC=1 cargo test -p kubelet pod_fields_doc -->\n\n\
         Every field of `v1.Pod` (k8s-openapi's schema, walked field by field from `Pod`; the\n\
         fields of a type are listed when the field that holds it is handled). No field is\n\
         accepted and silently ignored:\n\n\
         - **handled**: acted on as upstream's kubelet does; the test named shows the effect.\n\
         - **refused**: not provided; the pod gets the message shown (at admission the pod fails\n  \
         with reason `UnsupportedPodField`, or as noted).\n\
         - **elsewhere**: not the kubelet's to act on, as with upstream's kubelet.\n\
         - **not yet**: not acted on yet and nothing to refuse when the pod is created; what\n  \
         happens today.\n\n\
         ## Values refused at admission\n\n\
         | field | reason | message |\n|---|---|---|\n",
    );
    for r in refuse::REFUSALS {
        s.push_str(&format!(
            "| `{}.{}` | `{}` | {} |\n",
            r.owner,
            r.field,
            r.reason,
            cell(r.message)
        ));
    }
    let mut owner = "";
    for e in table::TABLE {
        if e.owner != owner {
            owner = e.owner;
            s.push_str(&format!(
                "\n## {owner}\n\n| field | | test, message or reader |\n|---|---|---|\n"
            ));
        }
        let (kind, text) = match e.fate {
            Fate::Handled(t) => ("handled", format!("`{t}`")),
            Fate::Refused(m, "") => ("refused", format!("{} (at admission)", cell(m))),
            Fate::Refused(m, t) => ("refused", format!("{} (`{t}`)", cell(m))),
            Fate::Elsewhere(w) => ("elsewhere", cell(w)),
            Fate::NotYet(w) => ("not yet", cell(w)),
        };
        s.push_str(&format!("| `{}` | {kind} | {text} |\n", e.field));
    }
    s
}

#[cfg(test)]
mod tests;
