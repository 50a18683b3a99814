//! The shortest way out: which characters move a parse towards a complete document, so a
//! generation that runs out of tokens is closed validly.

use super::machine::{ArrState, Frame, MapState, ObjState};
use super::schema::{Node, key_candidates, props};

/// Characters that move `stack` towards completion, best first.
pub(super) fn preferred(stack: &[Frame]) -> Vec<char> {
    let Some((top, below)) = stack.split_last() else { return Vec::new() };
    match top {
        Frame::Value(node) => first_chars(node),
        Frame::Object { node, next, state } => match state {
            ObjState::Open => vec!['{'],
            ObjState::BeforeKey { .. } => {
                let (_, may_close) = key_candidates(node, *next);
                if may_close { vec!['}', '"'] } else { vec!['"'] }
            }
            ObjState::Colon(_) => vec![':'],
            ObjState::AfterValue => vec!['}', ','],
        },
        Frame::Key { candidates, pos, node } => {
            let ps = props(node);
            let key = candidates.iter().rev().find(|&&i| ps[i].required).or(candidates.first());
            key.and_then(|&i| ps[i].key.get(*pos..)).and_then(|r| r.chars().next()).into_iter().collect()
        }
        Frame::Map { state, count, node } => match state {
            MapState::Open => vec!['{'],
            MapState::BeforeKey { comma: false } => vec!['}', '"'],
            MapState::BeforeKey { comma: true } => vec!['"'],
            MapState::Colon => vec![':'],
            MapState::AfterValue => {
                let room = matches!(&**node, Node::Map { max, .. } if count < max);
                if room { vec!['}', ','] } else { vec!['}'] }
            }
        },
        Frame::Array { node, state, .. } => match state {
            ArrState::Open => vec!['['],
            _ => {
                let mut v = vec![']', ','];
                if let Node::Array { items, .. } = &**node {
                    v.extend(first_chars(items));
                }
                v
            }
        },
        Frame::Str { node, len, dfa, open } => {
            if !open {
                vec!['"']
            } else if let (Node::Str { min, pattern: Some(p), .. }, Some(s)) = (&**node, dfa) {
                match p.shortest_completion(*s, *len, *min) {
                    Some(path) if !path.is_empty() => vec![path[0] as char],
                    _ => vec!['"'],
                }
            } else {
                vec!['"', 'a']
            }
        }
        // A number or literal that may end: the enclosing value decides what comes next.
        Frame::Num { spec, text } if spec.can_end(text) => preferred(below),
        Frame::Num { spec, text } => {
            let mut v: Vec<char> = "0123456789".chars().collect();
            // Prefer a digit after which the number can end.
            v.sort_by_key(|&d| !spec.can_end(&format!("{text}{d}")));
            v.push('-');
            v.push('.');
            v
        }
        Frame::Lit { options, alive, pos } if alive.iter().any(|&i| options[i].len() == *pos) => preferred(below),
        Frame::Lit { options, alive, pos } => {
            let shortest = alive.iter().min_by_key(|&&i| options[i].len());
            shortest.and_then(|&i| options[i].get(*pos..)).and_then(|r| r.chars().next()).into_iter().collect()
        }
    }
}

/// Characters a value of `node` may start with, best first.
fn first_chars(node: &Node) -> Vec<char> {
    match node {
        Node::Object(_) | Node::Map { .. } => vec!['{'],
        Node::Array { .. } => vec!['['],
        Node::Str { .. } => vec!['"'],
        Node::Num(_) => "0123456789-".chars().collect(),
        Node::Lit(options) => {
            let mut o: Vec<&String> = options.iter().collect();
            o.sort_by_key(|s| s.len());
            o.iter().filter_map(|s| s.chars().next()).collect()
        }
        Node::AnyOf(alts) => alts.iter().flat_map(|a| first_chars(a)).collect(),
    }
}
