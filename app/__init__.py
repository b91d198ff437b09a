"""ragscope's Streamlit app: thin pages over ``core`` (run ``streamlit run app/main.py``)."""
