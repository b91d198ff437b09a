"""The one place for the app's cached resources, cached computations and session state.

- Resources (``st.cache_resource``): the model (shared by every session; its own lock
  guards forward passes) and the SQLite store.
- Resources (``st.cache_resource``) also hold the fitted detectors shipped for the
  loaded model (keyed by its ``ModelInfo.key`` and the artifact files' stamps).
- Pure computations (``st.cache_data``): dataset files read into examples.
- Results computed piece by piece (``memo.Memo`` LRUs held as resources, shared by
  every session, keyed by model instance and input signature): the analysis of one
  example (render -> trace -> surprisal) and the shipped detectors' verdicts on it,
  streamed one detector at a time; the Playground fills both from ONE shared pass.
- None of these reads ``st.session_state``; everything they depend on is an argument.
- Session state: one :class:`~app.state.session.AppState` object per session, from
  :func:`~app.state.session.app_state`. Each page family's module holds its widget keys
  (the ``KEY_*`` constants) and cached computations; pages and tests import them from
  that module (this package re-exports nothing).

The model spec comes from the environment: ``RAGSCOPE_MODEL`` (default
``embedded``; tests use ``tiny``) and ``RAGSCOPE_DEVICE`` (default ``auto``).

Modules: ``model``, ``datasets``, ``runs``, ``memo``, ``analysis``, ``detectors``,
``verdicts``, ``estimates``, ``heads``, ``spad_views``, ``features``, ``playground``,
``session``, ``links``.
"""
