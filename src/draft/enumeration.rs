//! The prompt's enumerations of names: `… answer with a JSON object: name, job_title, company, email`. An
//! answer that fills such a list writes its keys in the listed order, so after the key `job_title` the
//! next key is `company`. Neither the pack (learned from other requests, whose lists differ) nor a copy of
//! the request's text (which repeats the previous key, or copies the list with its commas) proposes it.
//!
//! An item is an identifier (`[A-Za-z_][A-Za-z0-9_]*`) on token boundaries; a list is three or more items
//! joined by `,`, `, and`, `, or`, `and` or `or`. Each item is kept in the tokens a key spells it with: the
//! prompt's own tokens, the first without the space it had in the sentence (` job` `_title` → `job`
//! `_title`, the way byte-level BPE and SentencePiece split a word after a quote).

use super::syntax::TokenTexts;

/// Lists longer than this are cut (the rest of the prompt is prose, not a field list).
const MAX_ITEMS: usize = 64;
/// Items with more tokens are not proposed.
const MAX_ITEM_TOKENS: usize = 8;

#[derive(Clone, Debug, Default)]
struct Item {
    text: Vec<u8>,
    /// Key-form tokens; empty when the prompt's spelling could not be turned into one.
    tokens: Vec<i32>,
}

/// The enumerations found in one prompt.
#[derive(Clone, Debug, Default)]
pub struct Enumerations {
    /// Every list's items, lists in prompt order.
    lists: Vec<Vec<Item>>,
}

impl Enumerations {
    /// Finds the lists in `prompt`.
    pub fn from_prompt(texts: &TokenTexts, prompt: &[i32]) -> Enumerations {
        let mut text = Vec::new();
        let mut starts = Vec::with_capacity(prompt.len() + 1);
        for &t in prompt {
            starts.push(text.len());
            text.extend_from_slice(texts.get(t));
        }
        starts.push(text.len());
        let token_at = |offset: usize| starts.binary_search(&offset).ok();

        let mut lists = Vec::new();
        let mut list: Vec<Item> = Vec::new();
        let mut prev_end = None;
        for (start, end) in identifiers(&text) {
            if matches!(&text[start..end], b"and" | b"or") {
                continue; // part of the separator
            }
            let joined = prev_end.is_some_and(|e| is_separator(&text[e..start]));
            if !joined || list.len() >= MAX_ITEMS {
                if list.len() >= 3 {
                    lists.push(std::mem::take(&mut list));
                }
                list.clear();
            }
            // The item's tokens: from the one starting at the identifier (or at the space before it) to the one
            // ending with it.
            let first = token_at(start).or_else(|| (start > 0 && text[start - 1] == b' ').then(|| token_at(start - 1)).flatten());
            let tokens = match (first, token_at(end)) {
                (Some(a), Some(b)) if b > a && b - a <= MAX_ITEM_TOKENS => key_form(texts, &prompt[a..b]),
                _ => Vec::new(),
            };
            list.push(Item { text: text[start..end].to_vec(), tokens });
            prev_end = Some(end);
        }
        if list.len() >= 3 {
            lists.push(list);
        }
        Enumerations { lists }
    }

    /// The key-form tokens of the item after `key` in the first list holding `key`, if it has one.
    pub fn after(&self, key: &[u8]) -> Option<&[i32]> {
        self.lists.iter().find_map(|l| {
            let i = l.iter().position(|it| it.text == key)?;
            Some(l.get(i + 1).map_or(&[][..], |it| &it.tokens[..]))
        }).filter(|t| !t.is_empty())
    }

    /// The key-form tokens of the first item of the first list holding `key`.
    pub fn first_with(&self, key: &[u8]) -> Option<&[i32]> {
        self.lists.iter().find(|l| l.iter().any(|it| it.text == key)).map(|l| &l[0].tokens[..]).filter(|t| !t.is_empty())
    }

    /// The key-form tokens of the first item of the prompt's first list.
    pub fn first(&self) -> Option<&[i32]> {
        self.lists.first().map(|l| &l[0].tokens[..]).filter(|t| !t.is_empty())
    }

    pub fn is_empty(&self) -> bool {
        self.lists.is_empty()
    }
}

/// `tokens` as a key spells them: the first without its leading space. Empty if no token has that text.
fn key_form(texts: &TokenTexts, tokens: &[i32]) -> Vec<i32> {
    let Some((&first, rest)) = tokens.split_first() else { return Vec::new() };
    let first = if texts.get(first).first() == Some(&b' ') { texts.unspaced(first) } else { Some(first) };
    match first {
        Some(f) => std::iter::once(f).chain(rest.iter().copied()).collect(),
        None => Vec::new(),
    }
}

/// Byte ranges of the identifiers in `text`.
fn identifiers(text: &[u8]) -> impl Iterator<Item = (usize, usize)> + '_ {
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut i = 0;
    std::iter::from_fn(move || {
        while i < text.len() {
            if word(text[i]) && (i == 0 || !word(text[i - 1])) {
                let start = i;
                while i < text.len() && word(text[i]) {
                    i += 1;
                }
                // Not a number, nor part of `e-mail`, `don't`, `a@b.c`, `v1.2`.
                let joined_on = i + 1 < text.len() && matches!(text[i], b'-' | b'\'' | b'@' | b'.') && word(text[i + 1]);
                if !text[start].is_ascii_digit() && !joined_on {
                    return Some((start, i));
                }
            } else {
                i += 1;
            }
        }
        None
    })
}

/// `,`, `, and`, `, or`, `and`, `or`, with spaces around.
fn is_separator(gap: &[u8]) -> bool {
    let words: Vec<&[u8]> = gap.split(|&b| b == b' ').filter(|w| !w.is_empty()).collect();
    matches!(words.as_slice(), [b","] | [b",", b"and"] | [b",", b"or"] | [b"and"] | [b"or"])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy vocabulary: words with and without a leading space, split as BPE would.
    fn vocab() -> (TokenTexts, impl Fn(&str) -> i32) {
        let words = [
            "Extract", ":", " name", ",", " job", "_title", " company", " email", ".", " and", " or", "name", "job", "company",
            "email", " Use", " null", " date", "date", " description", " quantity", " unit", "_price", "description", "quantity",
            "unit", "\n", " items",
        ];
        let bytes: Vec<&[u8]> = words.iter().map(|w| w.as_bytes()).collect();
        let texts = TokenTexts::new(&bytes);
        let words: Vec<String> = words.iter().map(|w| w.to_string()).collect();
        (texts, move |w: &str| words.iter().position(|x| x == w).unwrap() as i32)
    }

    fn tokens(id: &impl Fn(&str) -> i32, words: &[&str]) -> Vec<i32> {
        words.iter().map(|w| id(w)).collect()
    }

    #[test]
    fn lists_give_the_next_key_in_key_form() {
        let (texts, id) = vocab();
        let prompt = tokens(&id, &["Extract", ":", " name", ",", " job", "_title", ",", " company", ",", " email", ".", " Use", " null", "."]);
        let e = Enumerations::from_prompt(&texts, &prompt);
        assert_eq!(e.after(b"name"), Some(&tokens(&id, &["job", "_title"])[..]));
        assert_eq!(e.after(b"job_title"), Some(&tokens(&id, &["company"])[..]));
        assert_eq!(e.after(b"email"), None, "the last item has no successor");
        assert_eq!(e.after(b"null"), None, "prose is no list");
        assert_eq!(e.first(), Some(&tokens(&id, &["name"])[..]));
        assert_eq!(e.first_with(b"company"), Some(&tokens(&id, &["name"])[..]));
    }

    #[test]
    fn and_joins_items_and_short_runs_are_no_lists() {
        let (texts, id) = vocab();
        let prompt = tokens(&id, &[" name", " and", " date", ".", "\n", " description", ",", " quantity", " and", " unit", "_price", "."]);
        let e = Enumerations::from_prompt(&texts, &prompt);
        assert_eq!(e.after(b"name"), None, "two items are a phrase, not a field list");
        assert_eq!(e.after(b"quantity"), Some(&tokens(&id, &["unit", "_price"])[..]));
        assert_eq!(e.first(), Some(&tokens(&id, &["description"])[..]));
    }

    #[test]
    fn an_item_without_a_key_form_token_is_not_proposed() {
        let (texts, id) = vocab();
        // " items" has no unspaced twin in the vocabulary.
        let prompt = tokens(&id, &[" name", ",", " email", ",", " items"]);
        let e = Enumerations::from_prompt(&texts, &prompt);
        assert_eq!(e.after(b"name"), Some(&tokens(&id, &["email"])[..]));
        assert_eq!(e.after(b"email"), None);
        assert!(Enumerations::from_prompt(&texts, &[]).is_empty());
    }
}
