//! Answer metrics as in the QA literature (SQuAD normalisation: lower case, no punctuation, no
//! articles, single spaces): exact match and token F1 against the best golden answer.

use std::collections::HashMap;

/// Normalises an answer for comparison as SQuAD does: lower case, punctuation deleted, articles
/// dropped, single spaces. Semicolons separate a multi-objective task's answers, so they survive
/// as words.
pub fn normalize(text: &str) -> String {
    let lower = text.to_lowercase();
    let mut kept = String::with_capacity(lower.len());
    for c in lower.chars() {
        match c {
            ';' => kept.push_str(" ; "),
            c if c.is_alphanumeric() || c.is_whitespace() => kept.push(c),
            _ => {}
        }
    }
    kept.split_whitespace().filter(|w| !matches!(*w, "a" | "an" | "the")).collect::<Vec<_>>().join(" ")
}

/// A golden answer that normalises to nothing (a multiple-choice letter "A", "?") is compared
/// case-insensitively as written instead.
fn comparable(text: &str) -> String {
    let n = normalize(text);
    if n.is_empty() { text.trim().to_lowercase() } else { n }
}

/// 1.0 when the normalised prediction equals a normalised golden answer.
pub fn exact_match(prediction: &str, golden: &[String]) -> f64 {
    let p = comparable(prediction);
    if !p.is_empty() && golden.iter().any(|g| comparable(g) == p) { 1.0 } else { 0.0 }
}

/// The best token F1 of the prediction against any golden answer.
pub fn f1(prediction: &str, golden: &[String]) -> f64 {
    golden.iter().map(|g| token_f1(&comparable(prediction), &comparable(g))).fold(0.0, f64::max)
}

/// The share of a multi-objective answer's objectives answered right: the golden answer's
/// `;`-separated parts found among the prediction's parts (each part used once), over the larger
/// of the two counts, so that listing extra guesses costs as much as leaving objectives out. An
/// answer with one objective scores its exact match. Best over the golden answers.
pub fn objective_credit(prediction: &str, golden: &[String]) -> f64 {
    let parts =
        |s: &str| comparable(s).split(';').map(|p| p.trim().to_string()).filter(|p| !p.is_empty()).collect::<Vec<_>>();
    let predicted = parts(prediction);
    golden
        .iter()
        .map(|g| {
            let wanted = parts(g);
            if wanted.len() <= 1 {
                return exact_match(prediction, std::slice::from_ref(g));
            }
            let mut left = predicted.clone();
            let hits = wanted
                .iter()
                .filter(|w| match left.iter().position(|p| p == *w) {
                    Some(i) => {
                        left.swap_remove(i);
                        true
                    }
                    None => false,
                })
                .count();
            hits as f64 / wanted.len().max(predicted.len()) as f64
        })
        .fold(0.0, f64::max)
}

fn token_f1(prediction: &str, golden: &str) -> f64 {
    let tokens = |s: &str| s.split_whitespace().filter(|w| *w != ";").map(str::to_string).collect::<Vec<_>>();
    let p = tokens(prediction);
    let g = tokens(golden);
    if p.is_empty() || g.is_empty() {
        return 0.0;
    }
    let mut counts: HashMap<&str, i64> = HashMap::new();
    for w in &g {
        *counts.entry(w).or_default() += 1;
    }
    let mut common = 0;
    for w in &p {
        if let Some(c) = counts.get_mut(w.as_str())
            && *c > 0
        {
            *c -= 1;
            common += 1;
        }
    }
    if common == 0 {
        return 0.0;
    }
    let precision = common as f64 / p.len() as f64;
    let recall = common as f64 / g.len() as f64;
    2.0 * precision * recall / (precision + recall)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalisation_ignores_case_articles_and_punctuation() {
        let g = vec!["The Keltis Works".to_string()];
        assert_eq!(exact_match("keltis works.", &g), 1.0);
        assert_eq!(exact_match("Keltis", &g), 0.0);
        let f = f1("Keltis", &g);
        assert!((f - 2.0 / 3.0).abs() < 1e-9, "{f}");
        assert_eq!(f1("", &g), 0.0);
        assert_eq!(exact_match("1; 2", &["1;2".to_string()]), 1.0);
        assert_eq!(exact_match("1; 2", &["1 2".to_string()]), 0.0);
        // SQuAD deletes punctuation; an empty answer never matches; "A" stays comparable.
        assert_eq!(exact_match("U.S.", &["US".to_string()]), 1.0);
        assert_eq!(exact_match("1,234", &["1234".to_string()]), 1.0);
        assert_eq!(exact_match("", &["A".to_string()]), 0.0);
        assert_eq!(exact_match("The", &["A".to_string()]), 0.0);
        assert_eq!(exact_match("a", &["A".to_string()]), 1.0);
        assert_eq!(f1("?", &["A".to_string()]), 0.0);
        assert_eq!(f1("1; 2", &["1;2".to_string()]), 1.0);
    }

    #[test]
    fn objective_credit_counts_the_objectives_answered_right() {
        let g = vec!["2535928; Quilu; The Keltis Works".to_string()];
        assert_eq!(objective_credit("2535928; quilu; keltis works", &g), 1.0);
        // Order does not matter; one right of three is a third.
        assert_eq!(objective_credit("Keltis Works; 2535928; Quilu", &g), 1.0);
        assert!((objective_credit("2535928", &g) - 1.0 / 3.0).abs() < 1e-12);
        assert!((objective_credit("2535928; Rosne", &g) - 1.0 / 3.0).abs() < 1e-12);
        // Extra guesses divide by the larger count; a repeated part is matched once.
        assert!((objective_credit("2535928; Quilu; Keltis Works; Rosne", &g) - 0.75).abs() < 1e-12);
        assert!((objective_credit("2535928; 2535928", &g) - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(objective_credit("", &g), 0.0);
        // One objective: exact match, no credit for a right part among guesses.
        let one = vec!["Quilu".to_string()];
        assert_eq!(objective_credit("quilu.", &one), 1.0);
        assert_eq!(objective_credit("Quilu; Rosne", &one), 0.0);
        // The best golden answer counts.
        let two = vec!["1; 2".to_string(), "1; 3".to_string()];
        assert_eq!(objective_credit("3; 1", &two), 1.0);
    }
}
