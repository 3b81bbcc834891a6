//! A verdict board: one line per decided claim, its verdict as a coloured chip beside the claim,
//! the setting it was decided in and the scale. The front page's "results at a glance".

use std::path::Path;

use anyhow::Result;
use plotters::prelude::*;

use crate::{Figure, save_figure};

/// The outcome of one claim row, as the board colours it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The whole range lies on the paper's side (or inside the margin).
    Reproduced,
    /// The range straddles the threshold or the margin.
    Inconclusive,
    /// The whole range lies on the other side (or outside the margin).
    Refuted,
    /// The result is missing.
    Missing,
}

impl Outcome {
    /// Its colour on every chart (green, amber, red, grey).
    pub fn colour(self) -> RGBColor {
        match self {
            Outcome::Reproduced => RGBColor(44, 160, 44),
            Outcome::Inconclusive => RGBColor(240, 170, 40),
            Outcome::Refuted => RGBColor(214, 39, 40),
            Outcome::Missing => RGBColor(170, 170, 170),
        }
    }

    fn label(self) -> &'static str {
        match self {
            Outcome::Reproduced => "reproduced",
            Outcome::Inconclusive => "inconclusive",
            Outcome::Refuted => "refuted",
            Outcome::Missing => "no verdict",
        }
    }
}

/// One line of the board.
#[derive(Clone, Debug)]
pub struct BoardRow {
    /// The claim's id (`F4`, `G1-time`).
    pub id: String,
    /// What the paper claims, short.
    pub claim: String,
    /// The setting this row decides it in (`causal LM, context 4096`), or empty.
    pub setting: String,
    /// Its verdict.
    pub outcome: Outcome,
}

/// A board: a title, a footnote (the scale every row was decided at) and the rows, top to bottom.
#[derive(Clone, Debug)]
pub struct Board {
    /// Title above the rows.
    pub title: String,
    /// One line below the rows.
    pub footnote: String,
    /// The rows, in order.
    pub rows: Vec<BoardRow>,
}

const ROW: i32 = 24;
const TOP: i32 = 48;
const WIDTH: u32 = 1300;
/// A longer line is cut with an ellipsis (the full text is in claims.md).
const MAX_CHARS: usize = 165;

impl Board {
    /// Writes `<stem>.png` and `<stem>.svg`.
    pub fn save(&self, stem: &Path) -> Result<()> {
        let height = (TOP + ROW * self.rows.len() as i32 + 40) as u32;
        save_figure(stem, (WIDTH, height), self)
    }
}

impl Figure for Board {
    fn draw_on<DB: DrawingBackend>(
        &self,
        root: DrawingArea<DB, plotters::coord::Shift>,
    ) -> Result<()>
    where
        DB::ErrorType: 'static,
    {
        let err = |e| anyhow::anyhow!("{e:?}");
        root.fill(&WHITE).map_err(err)?;
        let text = |s: &str, x: i32, y: i32, size: i32, colour: RGBColor| {
            Text::new(
                s.to_string(),
                (x, y),
                ("sans-serif", size).into_font().color(&colour),
            )
        };
        root.draw(&text(&self.title, 12, 12, 20, BLACK))
            .map_err(err)?;
        for (i, row) in self.rows.iter().enumerate() {
            let y = TOP + ROW * i as i32;
            if i % 2 == 1 {
                root.draw(&Rectangle::new(
                    [(0, y - 3), (WIDTH as i32, y + ROW - 3)],
                    RGBColor(245, 245, 245).filled(),
                ))
                .map_err(err)?;
            }
            root.draw(&text(&row.id, 12, y, 15, BLACK)).map_err(err)?;
            root.draw(&Rectangle::new(
                [(80, y - 1), (190, y + ROW - 6)],
                row.outcome.colour().filled(),
            ))
            .map_err(err)?;
            root.draw(&text(row.outcome.label(), 88, y + 2, 14, WHITE))
                .map_err(err)?;
            let mut line = if row.setting.is_empty() {
                row.claim.clone()
            } else {
                format!("{}  ({})", row.claim, row.setting)
            };
            if line.chars().count() > MAX_CHARS {
                line = line.chars().take(MAX_CHARS - 1).collect::<String>() + "…";
            }
            root.draw(&text(&line, 204, y, 14, BLACK)).map_err(err)?;
        }
        let y = TOP + ROW * self.rows.len() as i32 + 10;
        root.draw(&text(&self.footnote, 12, y, 13, RGBColor(90, 90, 90)))
            .map_err(err)?;
        root.present().map_err(err)?;
        Ok(())
    }
}
