//! Code editing, the most common use of a local coding model: a whole function and an instruction to change
//! it, where the answer re-emits most of the code. Built from HumanEval's canonical solutions, so every
//! prompt is real code that runs; the edit kinds rotate so that the project's held-out split (every 4th
//! prompt) gets each kind too.

/// What the user asks of the code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Edit {
    /// Rename the function to camelCase (or `_v2` when it has one word) and every call to it.
    Rename,
    /// Drop the function's docstring.
    RemoveDocstring,
    /// The code comes without its docstring; the user asks for a Google-style one.
    AddDocstring,
    /// One comparison or constant of the solution is flipped; the user asks for the fix.
    FixBug,
}

impl Edit {
    const ALL: [Edit; 4] = [Edit::Rename, Edit::RemoveDocstring, Edit::AddDocstring, Edit::FixBug];

    /// The kind for the task at `index`: rotates within every block of 4 and shifts by one per block, so
    /// indices 3, 7, 11, 15 (held out) cover all four kinds.
    pub fn for_index(index: usize) -> Edit {
        Edit::ALL[(index + index / 4) % 4]
    }

    pub fn name(self) -> &'static str {
        match self {
            Edit::Rename => "rename",
            Edit::RemoveDocstring => "remove-docstring",
            Edit::AddDocstring => "add-docstring",
            Edit::FixBug => "fix-bug",
        }
    }
}

/// A code-edit prompt for one HumanEval task (`prompt` + `canonical_solution` = the whole code), with the
/// edit the task's index asks for, or a rename where that edit cannot be made on this code (no docstring
/// to remove, no operator to flip). Returns the kind used and the user message.
pub fn prompt(index: usize, code_prompt: &str, solution: &str, entry_point: &str) -> (Edit, String) {
    let code = format!("{code_prompt}{solution}");
    let made = match Edit::for_index(index) {
        Edit::Rename => None,
        Edit::RemoveDocstring => docstring_span(&code, entry_point).map(|_| {
            (Edit::RemoveDocstring, format!("Remove the docstring of `{entry_point}`."), code.clone())
        }),
        Edit::AddDocstring => docstring_span(&code, entry_point).map(|(a, b)| {
            let without = format!("{}{}", &code[..a], &code[b..]);
            let ask = format!("Add a Google-style docstring to `{entry_point}` that describes its arguments and what it returns.");
            (Edit::AddDocstring, ask, without)
        }),
        Edit::FixBug => flip(solution).map(|buggy| {
            let ask = format!("`{entry_point}` has a bug: one comparison or constant is wrong. Fix it.");
            (Edit::FixBug, ask, format!("{code_prompt}{buggy}"))
        }),
    };
    let (edit, ask, code) = made.unwrap_or_else(|| {
        let new = rename(entry_point);
        (Edit::Rename, format!("Rename the function `{entry_point}` to `{new}` and update every call to it."), code)
    });
    let text = format!(
        "{ask} Change nothing else. Answer with the whole changed code in one ```python block and nothing else.\n\n```python\n{}\n```",
        code.trim_end()
    );
    (edit, text)
}

/// The code a prompt asks to change: the contents of its first ```python block (what a client editing a file
/// would send as the request's predicted output).
pub fn code_block(text: &str) -> Option<&str> {
    let start = text.find("```python\n")? + "```python\n".len();
    let len = text[start..].find("\n```")?;
    Some(&text[start..start + len])
}

/// `has_close_elements` → `hasCloseElements`; a one-word name gets `_v2`.
fn rename(name: &str) -> String {
    let mut parts = name.split('_').filter(|p| !p.is_empty());
    let first = parts.next().unwrap_or(name).to_string();
    let rest: Vec<&str> = parts.collect();
    if rest.is_empty() {
        return format!("{name}_v2");
    }
    rest.iter().fold(first, |mut s, p| {
        let mut c = p.chars();
        if let Some(h) = c.next() {
            s.extend(h.to_uppercase());
            s.push_str(c.as_str());
        }
        s
    })
}

/// Byte range of the lines holding the docstring of `def entry_point(`: from the start of its opening
/// line to the end of its closing line.
fn docstring_span(code: &str, entry_point: &str) -> Option<(usize, usize)> {
    let def = code.find(&format!("def {entry_point}("))?;
    let body = def + code[def..].find('\n')? + 1;
    let first = code[body..].lines().find(|l| !l.trim().is_empty())?;
    let quote = ["\"\"\"", "'''"].into_iter().find(|q| first.trim_start().starts_with(q))?;
    let open = body + code[body..].find(quote)?;
    let close = open + 3 + code[open + 3..].find(quote)? + 3;
    let start = code[..open].rfind('\n').map_or(0, |i| i + 1);
    let end = code[close..].find('\n').map_or(code.len(), |i| close + i + 1);
    Some((start, end))
}

/// The solution with its first flippable operator or constant flipped (`<=` ↔ `<`, `>=` ↔ `>`, `==` ↔
/// `!=`, `+ 1` ↔ `- 1`), or None when it has none.
fn flip(solution: &str) -> Option<String> {
    const SWAPS: [(&str, &str); 8] =
        [(" <= ", " < "), (" >= ", " > "), (" < ", " <= "), (" > ", " >= "), (" == ", " != "), (" != ", " == "), (" + 1", " - 1"), (" - 1", " + 1")];
    let (at, from, to) = SWAPS.iter().filter_map(|(f, t)| solution.find(f).map(|i| (i, *f, *t))).min_by_key(|(i, _, _)| *i)?;
    Some(format!("{}{}{}", &solution[..at], to, &solution[at + from.len()..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROMPT: &str = "from typing import List\n\n\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n    \"\"\" Check if any two numbers are closer than threshold.\n    >>> has_close_elements([1.0, 2.0], 0.5)\n    False\n    \"\"\"\n";
    const SOLUTION: &str = "    for i, a in enumerate(numbers):\n        for b in numbers[i + 1:]:\n            if abs(a - b) < threshold:\n                return True\n    return False\n";

    #[test]
    fn the_code_block_is_the_code_to_change() {
        let (_, text) = prompt(0, PROMPT, SOLUTION, "has_close_elements");
        assert_eq!(code_block(&text), Some(format!("{PROMPT}{SOLUTION}").trim_end()));
        assert_eq!(code_block("no code here"), None);
        assert_eq!(code_block("```python\nunclosed"), None);
    }

    #[test]
    fn held_out_indices_cover_every_kind() {
        let held: Vec<Edit> = [3, 7, 11, 15].into_iter().map(Edit::for_index).collect();
        for k in Edit::ALL {
            assert!(held.contains(&k), "{k:?} never held out: {held:?}");
        }
    }

    #[test]
    fn rename_is_camel_case_or_v2() {
        assert_eq!(rename("has_close_elements"), "hasCloseElements");
        assert_eq!(rename("fib"), "fib_v2");
        let (k, text) = prompt(0, PROMPT, SOLUTION, "has_close_elements");
        assert_eq!(k, Edit::Rename);
        assert!(text.starts_with("Rename the function `has_close_elements` to `hasCloseElements`"), "{text}");
        assert!(text.contains(SOLUTION.trim_end()), "the whole code is in the prompt: {text}");
    }

    #[test]
    fn docstring_edits_keep_or_drop_exactly_the_docstring() {
        let (k, text) = prompt(1, PROMPT, SOLUTION, "has_close_elements");
        assert_eq!(k, Edit::RemoveDocstring);
        assert!(text.contains("\"\"\" Check if any"), "{text}");
        let (k, text) = prompt(2, PROMPT, SOLUTION, "has_close_elements");
        assert_eq!(k, Edit::AddDocstring);
        assert!(!text.contains("\"\"\"") && !text.contains(">>>"), "{text}");
        assert!(text.contains("-> bool:\n    for i, a in enumerate(numbers):"), "{text}");
    }

    #[test]
    fn fix_bug_flips_the_first_operator_only() {
        let (k, text) = prompt(3, PROMPT, SOLUTION, "has_close_elements");
        assert_eq!(k, Edit::FixBug);
        // `i + 1` comes before `< threshold`: it is the one flipped.
        assert!(text.contains("numbers[i - 1:]") && text.contains("< threshold"), "{text}");
        assert_eq!(flip("    return x\n"), None);
    }

    #[test]
    fn an_edit_that_cannot_be_made_falls_back_to_a_rename() {
        // No docstring, no operator.
        let (k, text) = prompt(1, "def f(x):\n", "    return x\n", "f");
        assert_eq!(k, Edit::Rename);
        assert!(text.starts_with("Rename the function `f` to `f_v2`"), "{text}");
        assert_eq!(prompt(3, "def f(x):\n", "    return x\n", "f").0, Edit::Rename);
    }
}
