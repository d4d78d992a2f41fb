//! The declarative compute graph (see ARCHITECTURE.md and the design of record).
