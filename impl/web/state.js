// The page's one mutable state. Everything that outlives a call lives here, by view;
// the modules hold no mutable variables of their own.

export const state = {
  // the requests waiting for the key dialog, or null when it is closed (api.js)
  keyWaiters: null,
  // the /api/events handlers, by event name (api.js)
  listeners: {},
  chat: {
    conversation: [], // the messages sent with the next request
    running: null, // the AbortController of the reply being streamed
    lastView: null, // the last assistant turn's TurnView, which Continue extends
  },
  header: {
    threads: 1, // the engine's own thread count, from /api/info (INFO-22), never the parameters
  },
  settings: {
    table: null, // the last /api/params
  },
  models: {
    downloads: {}, // the last `download` event of each catalog entry
  },
  batches: {
    byId: {}, // each batch's object: GET /v1/batches, then its `batch_job` events
  },
  steering: {
    pending: {}, // features added in the page, not yet given a strength: by attachment
  },
};
