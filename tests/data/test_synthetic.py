from dpbert.data.synthetic import ENTITY_TYPES, generate_labeled_notes, generate_notes, lexicon
from dpbert.data.words import split_words


def test_same_seed_same_notes_other_seed_other_notes():
    a = [d.text for d in generate_notes(patients=3, seed=1)]
    assert a == [d.text for d in generate_notes(patients=3, seed=1)]
    assert a != [d.text for d in generate_notes(patients=3, seed=2)]


def test_prefix_stability_across_corpus_sizes():
    small = list(generate_notes(patients=2, seed=5))
    big = list(generate_notes(patients=5, seed=5))
    assert big[: len(small)] == small


def test_structure_patients_admissions_ids_and_phi():
    docs = list(generate_notes(patients=4, admissions_per_patient=3, notes_per_admission=2, seed=0))
    assert len(docs) == 24
    assert len({d.patient_id for d in docs}) == 4 and len({d.admission_id for d in docs}) == 12
    assert len({d.doc_id for d in docs}) == 24
    text = docs[0].text
    for field in ("Name:", "MRN:", "DOB:", "HISTORY OF PRESENT ILLNESS", "ASSESSMENT AND PLAN"):
        assert field in text
    surnames = set(lexicon("surnames"))
    assert any(w in surnames for w in split_words(text))


def test_bio_labels_align_with_the_word_definition_and_cover_all_types():
    notes = list(generate_labeled_notes(patients=2, seed=3))
    for note in notes:
        assert list(note.words) == split_words(note.document.text)
        assert len(note.tags) == len(note.words)
        for prev, tag in zip(("O",) + note.tags, note.tags):
            if tag.startswith("I-"):
                assert prev[2:] == tag[2:], "I- tag must continue an entity of the same type"
    types = {t[2:] for n in notes for t in n.tags if t != "O"}
    assert types == set(ENTITY_TYPES)


# --- the in-domain NER task (ner.task: synthetic, issue 23 item 2) ---------------------------

def _spans(words, tags):
    from dpbert.evaluate.ner import extract_entities

    return [(e.type, tuple(words[e.start:e.end])) for e in extract_entities(tags)]


def test_ner_labels_are_the_inserted_lexicon_spans():
    """Every labelled span is an entry of its type's lexicon (words as split_words gives them; a
    typo changes one word of a few), every type occurs, and no lexicon entry is left unlabelled
    where the generator inserted it (the O words hold no multi-word entry of the lexicons)."""
    from dpbert.data.synthetic import ENTITY_LEXICONS, ner_sentences

    entries = {kind: {tuple(split_words(e)) for e in lexicon(name)} for kind, name in ENTITY_LEXICONS.items()}
    sentences = ner_sentences("train", 150) + ner_sentences("test", 150)
    assert len(sentences) == 300
    exact = typos = 0
    for words, tags in sentences:
        assert len(words) == len(tags) and all(t == "O" or t[:2] in ("B-", "I-") for t in tags)
        for kind, span in _spans(words, tags):
            if span in entries[kind]:
                exact += 1
            else:  # a typo: same length as an entry differing in one word
                typos += 1
                assert any(len(e) == len(span) and sum(a != b for a, b in zip(e, span)) == 1 for e in entries[kind]), span
    assert exact > 10 * typos > 0
    kinds = {kind for words, tags in sentences for kind, _ in _spans(words, tags)}
    assert kinds == set(ENTITY_TYPES)


def test_ner_train_uses_the_training_lexicon_part_and_test_holds_unseen_entries():
    from dpbert.data.synthetic import ENTITY_LEXICONS, lexicon_split, ner_sentences

    for name in ENTITY_LEXICONS.values():
        train, held = set(lexicon_split(name, "train")), set(lexicon_split(name, "heldout"))
        assert not train & held and train | held == set(lexicon(name)) and 0.15 < len(held) / len(lexicon(name)) < 0.45
    held = {kind: {tuple(split_words(e)) for e in lexicon_split(name, "heldout")} for kind, name in ENTITY_LEXICONS.items()}
    train_spans = [s for w, t in ner_sentences("train", 200) for s in _spans(w, t)]
    test_spans = [s for w, t in ner_sentences("test", 200) for s in _spans(w, t)]
    # training mentions come from the training part only (a held-out entry may appear as a substring
    # of a longer training entry's words, never as a whole mention)
    assert not any(span in held[kind] and span not in {tuple(split_words(e)) for e in lexicon_split(
        ENTITY_LEXICONS[kind], "train")} for kind, span in train_spans)
    unseen = sum(span in held[kind] for kind, span in test_spans)
    assert 0.25 < unseen / len(test_spans) < 0.75


def test_ner_patients_are_fresh_no_corpus_seed_reaches_their_stream():
    """The NER stream is keyed "ner:{split}:{seed}:{patient}", a corpus "{seed}:{patient}": no integer
    seed of a corpus gives an NER patient's notes (the key strings differ whatever the seeds), and
    the default corpus seed and the NER seed are different public constants."""
    import random

    from dpbert.config import SyntheticCorpusConfig
    from dpbert.data import synthetic

    assert SyntheticCorpusConfig().seed != synthetic.NER_SEED
    words = {tuple(w) for w, _ in synthetic.ner_sentences("train", 60)}
    for seed in (synthetic.NER_SEED, SyntheticCorpusConfig().seed, 0):
        corpus = " ".join(d.text for d in generate_notes(patients=3, seed=seed))
        corpus_sentences = {tuple(split_words(line)) for line in corpus.splitlines()}
        assert not {w for w in words if len(w) > 8} & corpus_sentences
    # a positive control of the check: the same stream key DOES reproduce the patient
    a = random.Random(f"ner:train:{synthetic.NER_SEED}:0").random()
    assert a == random.Random(f"ner:train:{synthetic.NER_SEED}:0").random()
    assert a != random.Random(f"{synthetic.NER_SEED}:0").random()
    assert synthetic.ner_sentences("test", 30) == synthetic.ner_sentences("test", 30)  # deterministic
    assert synthetic.ner_sentences("test", 30) != synthetic.ner_sentences("train", 30)
