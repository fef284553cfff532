import dataclasses

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


# --- the in-domain NER task (ner.task: synthetic) ----------------------------------------------

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


# --- the hospital shape (corpus.synthetic.shape: hospital) ------------------------------------

def test_hospital_notes_per_patient_are_heavy_tailed_with_the_stated_summary():
    """Counts alone (nothing rendered): median 2-3, mean 5-8, capped; MIMIC-like skew."""
    import statistics

    from dpbert.data.synthetic import HOSPITAL_MAX_NOTES, hospital_note_count

    counts = [hospital_note_count(p, seed=1234) for p in range(5_000)]
    assert 2 <= statistics.median(counts) <= 3
    assert 5.0 <= statistics.mean(counts) <= 8.0  # 5.9 (5,000 patients; 5.88 over 100,000)
    assert statistics.mean(counts) > 2 * statistics.median(counts)  # skewed
    assert min(counts) == 1 and max(counts) <= HOSPITAL_MAX_NOTES
    assert sum(c >= 50 for c in counts) > 25  # a heavy tail: P[≥ 50 notes] ≈ 1 %


def test_hospital_note_count_is_capped(monkeypatch):
    """Positive control of the cap: a draw far in the tail gives HOSPITAL_MAX_NOTES, not more."""
    import random

    from dpbert.data import synthetic

    class Tail(random.Random):
        def gauss(self, mu=0.0, sigma=1.0):
            return 50.0

    assert synthetic._draw_note_count(Tail(0)) == synthetic.HOSPITAL_MAX_NOTES
    assert synthetic._draw_note_count(random.Random(0)) < synthetic.HOSPITAL_MAX_NOTES


def _patients_with(min_notes, count, seed=1234):
    from dpbert.data.synthetic import hospital_note_count

    return [p for p in range(400) if hospital_note_count(p, seed) >= min_notes][:count]


def _inconsistencies(facts, notes, other_mrns):
    """What in ``notes`` disagrees with the patient's ``facts`` (empty when consistent)."""
    out = []
    dob = f"DOB: {facts['birth']:%m/%d/%Y}"
    for d in notes:
        kind = d.text.split("\n", 1)[0].lower()
        if d.patient_id != facts["patient_id"] or not all(
                x in d.text for x in (f"Name: {facts['name']}", f"MRN: {facts['mrn']}", dob)):
            out.append(f"{d.doc_id}: header")
        if not any(problem in d.text for problem in facts["problems"]):
            out.append(f"{d.doc_id}: no chronic problem")
        if kind != "radiology report" and not any(drug in d.text for drug in facts["treatments"]):
            out.append(f"{d.doc_id}: no home drug")
        if any(mrn in d.text for mrn in other_mrns):
            out.append(f"{d.doc_id}: another patient's MRN")
    admissions = {}
    for d in notes:
        admissions.setdefault(d.admission_id, []).append(d.text.split("\n", 1)[0].lower())
    if not all(k[-1] == "discharge summary" and k.count("discharge summary") == 1 for k in admissions.values()):
        out.append("an admission not closed by one discharge summary")
    return out


def test_hospital_facts_are_the_same_in_every_note_of_a_patient():
    from dpbert.data.synthetic import HOSPITAL_NOTE_TYPES, hospital_patient_facts, hospital_patient_notes

    patients = _patients_with(6, 4)
    assert len(patients) == 4
    types = set()
    for p in patients:
        facts, notes = hospital_patient_facts(p), hospital_patient_notes(p)
        assert len(notes) == facts["notes"] >= 6
        others = {hospital_patient_facts(q)["mrn"] for q in range(20) if q != p} - {facts["mrn"]}
        assert _inconsistencies(facts, notes, others) == []
        types |= {d.text.split("\n", 1)[0].lower() for d in notes}
    assert types == set(HOSPITAL_NOTE_TYPES)
    # Positive control: one note of another patient among p's notes (relabelled as p's) is caught.
    p, q = patients[:2]
    stranger = dataclasses.replace(hospital_patient_notes(q)[0], patient_id=hospital_patient_facts(p)["patient_id"])
    facts = hospital_patient_facts(p)
    assert _inconsistencies(facts, hospital_patient_notes(p)[:-1] + [stranger], {hospital_patient_facts(q)["mrn"]})


def test_hospital_patient_notes_are_a_function_of_the_seed_and_the_patient():
    from dpbert.data.synthetic import generate_hospital_notes, hospital_patient_notes

    streamed = list(generate_hospital_notes(patients=6, seed=7))
    p = 4
    on_demand = hospital_patient_notes(p, seed=7)
    assert on_demand == [d for d in streamed if d.patient_id == "P000004"]
    assert on_demand == hospital_patient_notes(p, seed=7)  # again: the same
    assert [d.text for d in on_demand] != [d.text for d in hospital_patient_notes(p, seed=8)]
    assert list(generate_hospital_notes(patients=3, seed=7, start=3)) == [d for d in streamed if d.patient_id >= "P000003"]
    assert len({d.doc_id for d in streamed}) == len(streamed)


def test_hospital_corpus_streams_without_materialising_it():
    import inspect
    import itertools

    from dpbert.data.synthetic import generate_hospital_notes

    stream = generate_hospital_notes(patients=10 ** 9, seed=3)  # a list of it could not exist
    assert inspect.isgenerator(stream)
    first = list(itertools.islice(stream, 12))
    assert len(first) == 12 and first[0].patient_id == "P000000"


def test_corpus_notes_follows_the_configured_shape():
    import itertools

    import pytest

    from dpbert.config import ConfigError, SyntheticCorpusConfig, load_config
    from dpbert.data.synthetic import corpus_notes, generate_hospital_notes

    fixed = SyntheticCorpusConfig(patients=3, admissions_per_patient=1, notes_per_admission=1, seed=5)
    assert SyntheticCorpusConfig().shape == "fixed"
    assert list(corpus_notes(fixed)) == list(generate_notes(3, 1, 1, 5))  # the default is unchanged
    hospital = SyntheticCorpusConfig(patients=3, seed=5, shape="hospital")
    assert list(itertools.islice(corpus_notes(hospital), 5)) == list(itertools.islice(generate_hospital_notes(3, 5), 5))
    with pytest.raises(ConfigError, match="corpus.synthetic.shape"):
        load_config(None, ["corpus.synthetic.shape=ward"], preset="demo")
    assert load_config(None, ["corpus.synthetic.shape=hospital"], preset="demo").corpus.synthetic.shape == "hospital"


def test_the_hospital_shape_is_another_dataset_with_its_own_ledger():
    """The synthetic corpus's dataset id names its generator's parameters: the hospital shape is
    another corpus (another ledger); the fixed shape's id is the one it always had."""
    import dataclasses
    import hashlib
    import json

    from dpbert.config import CorpusConfig, SyntheticCorpusConfig
    from dpbert.ledger.identity import synthetic_dataset_id

    s = SyntheticCorpusConfig(patients=100, seed=9)
    fixed = synthetic_dataset_id(CorpusConfig(synthetic=s))
    material = json.dumps({"patients": 100, "admissions_per_patient": 2, "notes_per_admission": 2, "seed": 9},
                          sort_keys=True)
    assert fixed == "synthetic-" + hashlib.sha256(material.encode("utf-8")).hexdigest()[:12]
    assert synthetic_dataset_id(CorpusConfig(synthetic=dataclasses.replace(s, shape="hospital"))) != fixed
