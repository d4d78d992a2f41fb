//! Stop strings over streamed text: text that could still become a stop string is held
//! back, so a caller never prints part of a stop sequence.

/// Scans streamed text for any of a set of stop strings.
#[derive(Debug, Clone, Default)]
pub struct StopScanner {
    stops: Vec<String>,
    pending: String,
    matched: Option<String>,
}

/// What one `push` released.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopEvent {
    /// Text that is safe to emit; generation goes on.
    Text(String),
    /// A stop string matched: emit this text (everything before the stop) and end.
    Stopped(String),
}

impl StopScanner {
    /// A scanner for `stops`; empty strings are ignored.
    pub fn new(stops: &[String]) -> Self {
        StopScanner {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            pending: String::new(),
            matched: None,
        }
    }

    /// Feeds newly decoded text.
    pub fn push(&mut self, text: &str) -> StopEvent {
        self.pending.push_str(text);
        // The earliest match wins; at one position, the first stop string listed.
        let hit = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|&(at, _)| at);
        if let Some((at, stop)) = hit {
            let out = self.pending[..at].to_string();
            self.matched = Some(stop.clone());
            self.pending.clear();
            return StopEvent::Stopped(out);
        }
        let hold = self.held_suffix_len();
        let cut = self.pending.len() - hold;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        StopEvent::Text(out)
    }

    /// The stop string that ended the text, once `push` has returned `Stopped`.
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }

    /// Releases whatever is still held back (generation ended for another reason).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Length of the longest suffix of `pending` that is a proper prefix of a stop
    /// string, measured at char boundaries.
    fn held_suffix_len(&self) -> usize {
        let p = &self.pending;
        let mut best = 0;
        for s in &self.stops {
            for (i, _) in p.char_indices() {
                let suffix = &p[i..];
                if suffix.len() < s.len() && s.starts_with(suffix) {
                    best = best.max(suffix.len());
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stops(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn holds_back_a_possible_prefix_then_releases_it() {
        let mut s = StopScanner::new(&stops(&["\n\n"]));
        assert_eq!(s.push("hello\n"), StopEvent::Text("hello".into()));
        assert_eq!(s.push("world"), StopEvent::Text("\nworld".into()));
        assert_eq!(s.finish(), "");
    }

    #[test]
    fn stops_across_pieces_and_drops_the_stop_text() {
        let mut s = StopScanner::new(&stops(&["END", "xyz"]));
        assert_eq!(s.push("abc E"), StopEvent::Text("abc ".into()));
        assert_eq!(s.push("NDtail"), StopEvent::Stopped("".into()));
        let mut s = StopScanner::new(&stops(&["END"]));
        assert_eq!(s.push("12ENDx"), StopEvent::Stopped("12".into()));
    }

    #[test]
    fn earliest_stop_wins_and_multibyte_text_is_safe() {
        let mut s = StopScanner::new(&stops(&["б", "a"]));
        assert_eq!(s.push("жбa"), StopEvent::Stopped("ж".into()));
        let mut s = StopScanner::new(&stops(&["日本語"]));
        assert_eq!(s.push("x日本"), StopEvent::Text("x".into()));
        assert_eq!(s.finish(), "日本");
    }

    #[test]
    fn the_matching_stop_string_is_reported() {
        let mut s = StopScanner::new(&stops(&["xyz", "END", "D"]));
        assert_eq!(s.matched(), None);
        assert_eq!(s.push("abc E"), StopEvent::Text("abc ".into()));
        assert_eq!(s.matched(), None);
        // "END" starts before "D": the earliest match is reported, not the shortest.
        assert_eq!(s.push("ND"), StopEvent::Stopped(String::new()));
        assert_eq!(s.matched(), Some("END"));
    }

    #[test]
    fn no_stops_passes_everything() {
        let mut s = StopScanner::new(&[]);
        assert_eq!(s.push("a\n"), StopEvent::Text("a\n".into()));
    }
}
