//! The core's tests: table tests, one per rule, and property tests over the simulator.

mod campaign;
mod confirm;
mod holder;
mod holder_world;
mod properties;
mod rules;
mod startup;
mod support;
mod wire;
