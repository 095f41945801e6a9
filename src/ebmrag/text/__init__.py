"""Text a clinician wrote, before any medicine is read into it: sentence splitting (English and Chinese, with
offsets) and the question's language."""
