//! The core's tests: table tests, one per rule, and property tests over the simulator.

mod acquire_wait;
mod admit;
mod campaign;
mod coalesce;
mod coalesce_props;
mod confirm;
mod holder;
mod holder_world;
mod known;
mod kv_facts;
mod lock_world;
mod micro;
mod priority_world;
mod properties;
mod replicas;
mod reply_scope;
mod rules;
mod service;
mod shard;
mod stand_in;
mod startup;
mod supervise;
mod support;
mod sweep;
mod tenant;
mod wire;
