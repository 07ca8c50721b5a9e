"""Built-in demo corpus: a seeded synthetic English-to-German-like parallel language.

The German side follows the rules that make translation need attention rather than a
word-by-word lookup: verb-second after a fronted adverb or clause, verb-final subordinate
clauses, separable particles, participles and infinitives at the clause end, extraposed
relative clauses, "kein" for a negated indefinite object, and agreement of articles and
adjectives with the gender, number and case of their noun. Only
``random.Random(seed).random()`` is drawn, so a seed gives the same pairs in every process
and Python version.
"""

from __future__ import annotations

import functools
import random
from collections import namedtuple

from . import demo_lexicon as lex  # the word lists: data, kept apart from the grammar

DEMO_SPLITS = ("train", "validation", "test")
MIN_SOURCE_WORDS, MAX_SOURCE_WORDS = 3, 30

_Noun = namedtuple("_Noun", "en en_pl de gender de_pl weak animate")
_Verb = namedtuple("_Verb", "en en3 en_part en_prt de de3 de_part de_prt aux")
_Phrase = namedtuple("_Phrase", "en de person gender animate negated")
# A clause keeps its German parts apart so the caller can order them for its position.
_Clause = namedtuple("_Clause", "en front subj fin mid nf final extra")


def _entries(text, sep=None):
    return [tuple(f.strip() for f in entry.split(sep)) for entry in text.split(";")]


def _english_s(word):
    """Plural of a noun or third-person singular of a verb: "boxes", "cities", "goes"."""
    if word.endswith(("s", "x", "ch", "sh", "o")):
        return word + "es"
    if word.endswith("y") and word[-2] not in "aeiou":
        return word[:-1] + "ies"
    return word + "s"


def _nouns(text, animate):
    nouns = []
    for en, de, gender, de_pl in _entries(text):
        en_sg, _, en_pl = en.partition("/")
        nouns.append(_Noun(en_sg, en_pl or _english_s(en_sg), de, gender[0], de_pl,
                           gender == "mw", animate))
    return tuple(nouns)


def _verbs(text):
    verbs = []
    for en, en_part, de, de3, de_part, *aux in _entries(text):
        en, _, en_prt = en.partition("+")
        de_prt, _, de_stem = de.rpartition("+")
        verbs.append(_Verb(en, _english_s(en), en_part, en_prt, de_stem, de3, de_part, de_prt,
                           aux[0] if aux else "h"))
    return tuple(verbs)


def _table(rows):
    """German endings keyed by case then gender ("p": plural of any gender); "-": none."""
    return {case: dict(zip("mfnp", [x.strip("-") for x in row.split()], strict=True))
            for case, row in zip(("nom", "acc", "dat"), rows.split("/"), strict=True)}


# Parsing the word lists is pure and takes about a millisecond.
_ANIMATE_NOUNS = _nouns(lex.ANIMATE, True)
_ALL_NOUNS = _ANIMATE_NOUNS + _nouns(lex.THINGS, False)
_ADJS, _FREQS, _MANNERS = _entries(lex.ADJECTIVES), _entries(lex.FREQUENCY, "="), _entries(lex.MANNER, "=")
_PREPS, _NUMS = _entries(lex.PREPOSITIONS, "="), _entries(lex.NUMBERS, "=")
_VERBS = {"trans": _verbs(lex.TRANSITIVE), "ditrans": _verbs(lex.DITRANSITIVE),
          "intrans": _verbs(lex.INTRANSITIVE), "report": _verbs(lex.REPORTING), "copula": (None,)}
_TIMES = {tense: [(en, de.split()) for en, de, tenses in _entries(lex.TIME, "=") if tense in tenses]
          for tense in "pfm"}
_IRREGULAR_FORMS = {verb: forms for verb, *forms in _entries(lex.IRREGULAR)}
_DEFINITE = _table("der die das die / den die das die / dem der dem den")
_STRONG = _table("er e es e / en e es e / em er em en")
_WEAK = _table("e e e en / en e e en / en en en en")
_EIN = _table("- e - e / en e - e / em er em en")  # ein, kein, mein, ...


def _pick(rng, seq):
    # Only random() is drawn: it is the one sequence Python promises to keep the same
    # across versions for a given seed.
    return seq[int(rng.random() * len(seq))]


def _weighted(rng, rows):
    """One of (weight, *values) rows whose weights sum to one."""
    r = rng.random()
    for row in rows:
        r -= row[0]
        if r < 0:
            return row
    return rows[-1]


def _inflect(stem, ending):
    # "müde" + "e" is "müde", not "müdee".
    return stem + (ending[1:] if stem.endswith("e") and ending.startswith("e") else ending)


_NUM_ADJS = ((0.55, 0), (0.33, 1), (0.12, 2))


def _noun_phrase(rng, case, nouns, negation=None):
    """Determiner, 0-2 adjectives and noun, declined for ``case``; ``negation`` "avoid"
    keeps out "no", "absorb" turns "a"/bare plural into "kein" in a negated clause."""
    noun = _pick(rng, nouns)
    plural = rng.random() < 0.35
    gender = "p" if plural else noun.gender
    _, kind, en_det, stem = _weighted(rng, lex.PL_DETS if plural else lex.SG_DETS)
    negated = False
    if negation and en_det == "no":
        kind, en_det, stem = "def", "the", ""
    elif negation == "absorb" and en_det in ("a", ""):
        kind, stem, negated = "ein", "kein", True  # "does not see a dog": "keinen Hund"
    de = []
    if kind == "num":
        num = _pick(rng, _NUMS) if rng.random() < 0.6 else (str(2 + int(rng.random() * 98)),) * 2
        en_det, kind = num[0], "none"
        de.append(num[1])
    endings = _WEAK
    if kind == "def":
        de.append(_DEFINITE[case][gender])
    elif kind == "dies":
        de.append(stem + _STRONG[case][gender])
    elif kind == "ein":
        de.append(stem + _EIN[case][gender])
        # Where the article has no ending the adjective shows gender: "ein großer Hund".
        endings = _WEAK if _EIN[case][gender] else _STRONG
    else:
        endings = _STRONG
    en = [en_det] if en_det else []
    adjectives = [_pick(rng, _ADJS) for _ in range(_weighted(rng, _NUM_ADJS)[1])]
    if len(adjectives) == 2 and adjectives[0] == adjectives[1]:
        del adjectives[1]
    if adjectives and rng.random() < 0.08:
        en.append("very")
        de.append("sehr")
    for en_adj, de_adj in adjectives:
        en.append(en_adj)
        de.append(_inflect(de_adj, endings[case][gender]))
    en.append(noun.en_pl if plural else noun.en)
    if plural:
        dative_n = case == "dat" and not noun.de_pl.endswith(("n", "s"))
        de.append(noun.de_pl + "n" if dative_n else noun.de_pl)
    else:
        de.append(noun.de_pl if noun.weak and case != "nom" else noun.de)
    if en[0] == "a" and en[1][0] in "aeiou":
        en[0] = "an"
    return _Phrase(en, de, "3p" if plural else "3s", gender, noun.animate, negated)


def _subject(rng, nouns, negation):
    """A nominative subject: a pronoun, a noun phrase or two coordinated ones."""
    r = rng.random()
    if r < 0.18:
        en, de, person = _pick(rng, lex.PRONOUNS)
        return _Phrase([en], [de], person, None, True, False)
    first = _noun_phrase(rng, "nom", nouns, negation)
    if r < 0.25:
        second = _noun_phrase(rng, "nom", nouns, negation)
        return _Phrase(first.en + ["and"] + second.en, first.de + ["und"] + second.de,
                       "3p", "p", True, False)
    return first


def _conjugate(stem, third, person):
    if stem in _IRREGULAR_FORMS:
        return _IRREGULAR_FORMS[stem][{"1s": 0, "3s": 1}.get(person, 2)]
    return {"1s": stem[:-2] + "e", "3s": third}.get(person, stem)


def _verb_group(verb, person, tense, modal, neg, freq):
    """English verb group; German finite verb, clause-final parts in a main clause and
    verb cluster in a subordinate one. ``verb`` None is the copula."""
    third = person == "3s"
    adv = [freq] if freq else []
    if verb is None:
        fin = _conjugate("sein", "", person)
        en = [{"1s": "am", "3s": "is"}.get(person, "are")] + (["not"] if neg else adv)
        return en, fin, [], [fin]
    prt = [verb.en_prt] if verb.en_prt else []
    if tense == "p":
        fin = _conjugate(verb.de, verb.de3, person)
        if neg:
            en = ["does" if third else "do", "not", verb.en] + prt
        else:
            en = adv + [verb.en3 if third else verb.en] + prt
        return en, fin, [verb.de_prt] if verb.de_prt else [], [verb.de_prt + fin]
    if tense == "f":
        fin = _conjugate("sein" if verb.aux == "s" else "haben", "", person)
        en = ["has" if third else "have"] + (["not"] if neg else adv) + [verb.en_part] + prt
        return en, fin, [verb.de_part], [verb.de_part, fin]
    if modal == "want":
        en = ["does" if third else "do", "not"] if neg else adv
        en += ["wants" if third else "want", "to"]
        de_modal = "wollen"
    elif neg:
        en = ["cannot" if modal == "can" else "must not"]
        # "must not" forbids, which German says with "darf nicht", not "muss nicht".
        de_modal = "können" if modal == "can" else "dürfen"
    else:
        en = [modal] + adv
        de_modal = "können" if modal == "can" else "müssen"
    fin = _conjugate(de_modal, "", person)
    infinitive = verb.de_prt + verb.de
    return en + [verb.en] + prt, fin, [infinitive], [infinitive, fin]


def _order(c, position):
    """German word order of a clause: "main" is verb-second (after a fronted adverb or
    the subject), "inverted" verb-first, "sub" verb-final."""
    if position == "sub":
        return c.subj + c.mid + c.final + c.extra
    if position == "inverted":
        return [c.fin] + c.subj + c.mid + c.nf + c.extra
    if c.front:
        return c.front + [c.fin] + c.subj + c.mid + c.nf + c.extra
    return c.subj + [c.fin] + c.mid + c.nf + c.extra


_CLAUSE_KINDS = ((0.42, "trans"), (0.2, "intrans"), (0.08, "ditrans"), (0.12, "copula"),
                 (0.18, "report"))
_RELATIVE_KINDS = ((0.55, "trans"), (0.3, "intrans"), (0.15, "copula"))
_ADVERB_KINDS = ((0.5, None), (0.2, "time"), (0.15, "freq"), (0.15, "manner"))
_TENSES = ((0.5, "p"), (0.3, "f"), (0.2, "m"))


def _clause(rng, depth, allow_front, antecedent=None):
    """One clause; ``depth`` bounds nested that-clauses and relative clauses, and an
    ``antecedent`` phrase makes it a relative clause whose subject is that phrase."""
    neg = rng.random() < 0.12
    if antecedent is not None:
        kind = _weighted(rng, _RELATIVE_KINDS)[1]
        pronoun = _DEFINITE["nom"][antecedent.gender]  # "der Hund, der ...", "die Katze, die ..."
        subj = _Phrase(["who" if antecedent.animate else "that"], [pronoun], antecedent.person,
                       None, False, False)
    else:
        kind = _weighted(rng, _CLAUSE_KINDS)[1]
        kind = "trans" if kind == "report" and depth == 0 else kind
        nouns = _ALL_NOUNS if kind == "copula" else _ANIMATE_NOUNS
        subj = _subject(rng, nouns, "avoid" if neg else None)
    subj_en, subj_de = subj.en, subj.de
    if depth > 0 and subj.gender is not None and len(subj.en) <= 3 and rng.random() < 0.06:
        rel = _clause(rng, 0, False, subj)  # centre-embedded: "der Mann, der schläft, sieht"
        subj_en, subj_de = subj_en + rel.en, subj_de + [","] + _order(rel, "sub") + [","]
    verb = _pick(rng, _VERBS[kind])
    tense = "p" if verb is None else _weighted(rng, _TENSES)[1]
    modal = _pick(rng, ("can", "must", "want"))
    adv_kind = _weighted(rng, _ADVERB_KINDS)[1]
    if (adv_kind == "freq" and neg or adv_kind == "manner" and kind in ("copula", "report")
            or adv_kind == "time" and kind == "report" and not allow_front):
        adv_kind = None
    freq = _pick(rng, _FREQS) if adv_kind == "freq" else ("", "")
    en_vg, fin, nf, final = _verb_group(verb, subj.person, tense, modal, neg, freq[0])
    time, front = None, False
    if adv_kind == "time":
        time = _pick(rng, _TIMES[tense])
        # English would hang a trailing time adverb on the that-clause, so front it.
        front = allow_front and (kind == "report" or rng.random() < 0.5)
    mid = time[1][:] if time and not front else []
    mid += [freq[1]] if freq[1] else []
    en_post, last_object = _complements(rng, kind, neg, adv_kind, mid)
    extra = []
    if time and not front:
        en_post.append(time[0])
        last_object = None
    if kind == "report":
        comp = _clause(rng, depth - 1, False)
        # English may drop "that"; "know" keeps it so that "knows the dog" stays "kennt".
        en_post += (["that"] if verb.de == "wissen" or rng.random() < 0.7 else []) + comp.en
        extra = [",", "dass"] + _order(comp, "sub")
    elif last_object is not None and depth > 0 and rng.random() < 0.15:
        # German moves a relative clause behind the clause-final verbs (extraposition).
        rel = _clause(rng, 0, False, last_object)
        en_post += rel.en
        extra = [","] + _order(rel, "sub")
    en = ([time[0]] if front else []) + subj_en + en_vg + en_post
    return _Clause(en, time[1][:] if front else [], subj_de, fin, mid, nf, final, extra)


def _complements(rng, kind, neg, adv_kind, mid):
    """A clause's objects, negation, predicate adjective, manner and prepositional phrase: the English words
    after the verb, and the German ones added to ``mid``; with the object a relative clause may attach to."""
    en_post, negated, last_object = [], False, None
    if kind == "ditrans":
        indirect = _noun_phrase(rng, "dat", _ANIMATE_NOUNS)
        en_post += indirect.en
        mid += indirect.de
    if kind in ("trans", "ditrans"):
        last_object = _noun_phrase(rng, "acc", _ALL_NOUNS, "absorb" if neg else None)
        en_post += last_object.en
        mid += last_object.de
        negated = last_object.negated
    if neg and not negated:
        mid.append("nicht")
    if kind == "copula":
        en_adj, de_adj = _pick(rng, _ADJS)
        very = rng.random() < 0.15
        en_post += ["very"] * very + [en_adj]
        mid += ["sehr"] * very + [de_adj]
    if adv_kind == "manner":
        en_manner, de_manner = _pick(rng, _MANNERS)
        en_post.append(en_manner)
        mid.append(de_manner)
        last_object = None
    if kind in ("trans", "intrans", "ditrans") and rng.random() < 0.3:
        en_prep, de_prep, case = _pick(rng, _PREPS)
        pobj = _noun_phrase(rng, case, _ALL_NOUNS)
        contracted = lex.CONTRACTIONS.get((de_prep, pobj.de[0]))
        en_post += [en_prep] + pobj.en
        mid += [contracted] + pobj.de[1:] if contracted else [de_prep] + pobj.de
        last_object = None
    return en_post, last_object


_SHAPES = ((0.5, "single"), (0.18, "coord"), (0.18, "sub"), (0.14, "fronted"))


def _sentence(rng):
    """English and German tokens of one sentence of one to three clauses."""
    shape = _weighted(rng, _SHAPES)[1]
    first = _clause(rng, 2 if rng.random() < 0.3 else 1, shape != "fronted")
    if shape == "fronted":
        en_conj, de_conj = _pick(rng, lex.SUBORDINATORS)
        main = _clause(rng, 1, False)
        # The fronted clause fills the prefield, so the main clause starts with its verb.
        en = [en_conj] + first.en + [","] + main.en
        de = [de_conj] + _order(first, "sub") + [","] + _order(main, "inverted")
        closed = bool(main.extra)
    else:
        en, de, closed = first.en, _order(first, "main"), bool(first.extra)
        if shape == "sub":
            en_conj, de_conj = _pick(rng, lex.SUBORDINATORS)
            sub = _clause(rng, 1, False)
            en, closed = en + [en_conj] + sub.en, True
            de = de + [",", de_conj] + _order(sub, "sub")
    if shape == "coord" or rng.random() < 0.1:
        en_conj, de_conj, verb_first = _pick(rng, lex.COORDINATORS)
        nxt = _clause(rng, 1, not verb_first)
        # A subordinate or relative clause before "und" is closed by a comma.
        de = de + [","] * closed + de_conj + _order(nxt, "inverted" if verb_first else "main")
        en = en + [en_conj] + nxt.en
    return en, de


def _render(tokens):
    """Tokens to text: commas attached, first letter capitalised, final period."""
    text = " ".join(tokens).replace(" ,", ",")
    while ",," in text:
        text = text.replace(",,", ",")
    return text[0].upper() + text[1:].rstrip(",") + "."


def _check_count(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def generate_pairs(num_pairs: int, seed: int = 0) -> list[tuple[str, str]]:
    """``num_pairs`` (English, German) pairs with distinct sources, the same for a seed."""
    _check_count("num_pairs", num_pairs, 0)
    rng = random.Random(seed)
    seen, pairs = set(), []
    # The grammar makes far more sentences than any corpus needs; the cap only stops a
    # request for more than it can make from looping forever.
    attempts_left = 20 * num_pairs + 1000
    while len(pairs) < num_pairs:
        if attempts_left == 0:
            raise ValueError(f"num_pairs={num_pairs} is more distinct pairs than the demo "
                             "grammar can make; ask for fewer")
        attempts_left -= 1
        en, de = _sentence(rng)
        source = _render(en)
        if MIN_SOURCE_WORDS <= len(source.split()) <= MAX_SOURCE_WORDS and source not in seen:
            seen.add(source)
            pairs.append((source, _render(de)))
    return pairs


def demo_corpus(num_train: int = 50_000, num_validation: int = 1_000, num_test: int = 1_000,
                seed: int = 0) -> dict[str, list[tuple[str, str]]]:
    """Train/validation/test pairs of the demo language; no source is in two splits."""
    counts = {"num_train": num_train, "num_validation": num_validation, "num_test": num_test}
    for name, value in counts.items():
        _check_count(name, value, 1)
    pairs = generate_pairs(num_train + num_validation + num_test, seed)
    # Shuffle before splitting: the shortest sentences come from a small space and are
    # drawn early, so the tail of the stream would give a test set with fewer of them.
    rng = random.Random(f"demo-corpus-split-{seed}")
    for i in range(len(pairs) - 1, 0, -1):
        j = int(rng.random() * (i + 1))
        pairs[i], pairs[j] = pairs[j], pairs[i]
    ends = (num_train, num_train + num_validation, len(pairs))
    return {split: pairs[ends[k - 1] if k else 0:ends[k]] for k, split in enumerate(DEMO_SPLITS)}


@functools.lru_cache(maxsize=1)
def _lemma_maps():
    """Surface word -> German lemma on each side, for the content words of the lexicon."""
    en, de = {}, {}
    for n in _ALL_NOUNS:
        en.update(dict.fromkeys((n.en, n.en_pl), n.de))
        de.update(dict.fromkeys((n.de.lower(), n.de_pl.lower(), n.de_pl.lower() + "n"), n.de))
    for en_adj, de_adj in _ADJS:
        en[en_adj] = de_adj
        de.update((_inflect(de_adj, e), de_adj) for e in ("", "e", "en", "er", "es", "em"))
    for verb in (v for kind in ("trans", "ditrans", "intrans", "report") for v in _VERBS[kind]):
        lemma = verb.de_prt + verb.de
        en.update(dict.fromkeys((verb.en, verb.en3, verb.en_part), lemma))
        forms = (verb.de, verb.de3, _conjugate(verb.de, verb.de3, "1s"), verb.de_part)
        de.update((prefix + w, lemma) for w in forms for prefix in ("", verb.de_prt))
    for en_word, de_word in _FREQS + _MANNERS + _NUMS:
        en[en_word], de[de_word] = de_word, de_word
    return en, de


def corpus_statistics(pairs) -> dict:
    """Counts, lengths in words and vocabulary sizes of (source, target) pairs, and the
    fraction whose target puts the content words shared with the source in another order."""
    pairs = list(pairs)
    if not pairs:
        raise ValueError("pairs is empty; pass at least one (source, target) pair")
    en_map, de_map = _lemma_maps()
    src_lens, tgt_lens, src_vocab, tgt_vocab, reordered = [], [], set(), set(), 0
    for source, target in pairs:
        src = [w.strip(",.").lower() for w in source.split()]
        tgt = [w.strip(",.").lower() for w in target.split()]
        src_lens.append(len(src))
        tgt_lens.append(len(tgt))
        src_vocab.update(src)
        tgt_vocab.update(tgt)
        src_keys = [en_map[w] for w in src if w in en_map]
        tgt_keys = [de_map[w] for w in tgt if w in de_map]
        shared = set(src_keys) & set(tgt_keys)
        reordered += [k for k in src_keys if k in shared] != [k for k in tgt_keys if k in shared]
    return {
        "num_pairs": len(pairs),
        "src_len_min": min(src_lens), "src_len_mean": sum(src_lens) / len(pairs),
        "src_len_max": max(src_lens),
        "tgt_len_min": min(tgt_lens), "tgt_len_mean": sum(tgt_lens) / len(pairs),
        "tgt_len_max": max(tgt_lens),
        "src_vocab_size": len(src_vocab), "tgt_vocab_size": len(tgt_vocab),
        "reordered_fraction": reordered / len(pairs),
    }
