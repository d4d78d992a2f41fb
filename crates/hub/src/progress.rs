//! Progress reporting on stderr.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::time::Duration;

/// Whether to report on stderr: a one-line note per step, plus bars when stderr is a terminal
/// (indicatif's stderr target draws nothing otherwise, so logs stay clean).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Progress {
    pub(crate) enabled: bool,
}

impl Progress {
    /// Prints a one-line note on stderr when enabled.
    pub(crate) fn note(&self, msg: &str) {
        if self.enabled {
            eprintln!("{msg}");
        }
    }

    /// A byte counter towards `total` (a spinner when the total is unknown).
    pub(crate) fn bytes(&self, total: Option<u64>, msg: impl Into<String>) -> ProgressBar {
        if !self.enabled {
            return ProgressBar::hidden();
        }
        let (bar, template) = match total {
            Some(t) => (
                ProgressBar::with_draw_target(Some(t), ProgressDrawTarget::stderr()),
                "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
            ),
            None => (
                ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()),
                "{spinner} {msg} {bytes} {binary_bytes_per_sec}",
            ),
        };
        // The templates are constants; falling back to the default style cannot lose data.
        let style =
            ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style.progress_chars("=> "));
        bar.set_message(msg.into());
        // Keeps the bar visibly alive while pip runs without reporting bytes.
        bar.enable_steady_tick(Duration::from_millis(200));
        bar
    }
}
