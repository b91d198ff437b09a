"""The app's pages, one Streamlit page script each (run through ``st.navigation``).

Not named ``pages/``: Streamlit treats a ``pages/`` folder beside the entry script as
a v1 multipage app, and a first visit straight to ``/playground`` would then run the
page script without ``app/main.py`` (no navigation, no page config, no model status).
"""
