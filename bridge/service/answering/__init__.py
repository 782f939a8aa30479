"""From a batch of events to answers.json and the word back: the pipeline, the timeline's order, attachments, notices, study sets."""
