//! scheduler: see README.md.
