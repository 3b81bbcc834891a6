//! Property and equivalence tests of the model zoo, on random inputs and weights. Each compares two
//! computations that must agree (or a quantity against a bound) and fails when they do not.

mod causality;
mod chunked;
mod common;
mod fused;
mod gau_formula;
mod losses;
mod overfit;
mod padding;
mod params;
mod performer;
mod t5;
mod t5_hf;
