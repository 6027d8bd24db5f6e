//! Starting a pipeline: the emitter thread, the shared state the sequencer and the emitter
//! both reach, and the sequencer that feeds them.

use std::sync::Arc;

use crate::emitter::EmitShared;
use crate::{BuildError, Config, Counters, Emitter, Sequencer, Sink, Stage, flows};

/// Starts a pipeline: the emitter thread begins waiting, and the returned [`Sequencer`] feeds
/// it. Dropping the sequencer drains everything in flight to the sink and ends the emitter;
/// [`Emitter::join`] then gives the sink back.
///
/// # Errors
/// [`BuildError`] for an invalid configuration or when the thread cannot be spawned.
pub fn start<S, K>(
    config: &Config,
    pool: Arc<rayon::ThreadPool>,
    stage: S,
    sink: K,
) -> Result<(Sequencer<S>, Emitter<K>), BuildError>
where
    S: Stage,
    K: Sink<Item = S::Item>,
{
    start_with_express(config, pool, stage, sink, None)
}

/// Starts a pipeline as [`start`] does, whose express lane ([`Sequencer::push_flow`]) emits
/// into `express` when given: a second sink to the same place (another handle on the socket),
/// used on the sequencer's thread only, so that an express packet never waits for the
/// emitter's lock while the emitter sends a bulk batch. The emitter tells the sparse flows'
/// table that a packet is out only once its sink has flushed it, so an express packet still
/// never overtakes its own flow's.
///
/// # Errors
/// [`BuildError`] for an invalid configuration or when the thread cannot be spawned.
pub fn start_with_express<S, K>(
    config: &Config,
    pool: Arc<rayon::ThreadPool>,
    stage: S,
    sink: K,
    express: Option<K>,
) -> Result<(Sequencer<S>, Emitter<K>), BuildError>
where
    S: Stage,
    K: Sink<Item = S::Item>,
{
    if config.batch_size == 0 || config.batches_in_flight == 0 {
        return Err(BuildError::Config);
    }
    let counters = Arc::new(Counters::default());
    let (done_tx, done_rx) = crossbeam_channel::bounded(config.batches_in_flight);
    // Batch buffers come back here; the sequencer makes them on first use.
    let (free_tx, free_rx) = crossbeam_channel::bounded(config.batches_in_flight);
    // Only an ordered pipeline knows a flow's packets are out once a later one is.
    let flows = flows::FlowTable::new(
        if config.ordering {
            config.sparse_rate
        } else {
            0
        },
        config.sparse_burst,
        config.express_rate,
    );
    let shared = Arc::new(EmitShared::new(
        config,
        sink,
        free_tx,
        counters.clone(),
        flows.as_ref().map(flows::FlowTable::emitted),
    ));
    let emitter = Emitter::spawn(config, shared.clone(), done_rx, counters.clone())?;
    let sequencer = Sequencer::new(
        config,
        Arc::new(stage),
        pool,
        shared,
        done_tx,
        free_rx,
        counters,
        flows,
        express.map(|k| Box::new(k) as Box<dyn Sink<Item = S::Item>>),
    );
    Ok((sequencer, emitter))
}
