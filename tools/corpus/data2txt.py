"""Data-to-text templates: a JSON record (one passage) and a prose description.

The passage is ``json.dumps`` of a dict (flat or nested, with varied key styles); the
question is ``None`` (the prompt asks for a description). Booleans and status fields
become contradiction slots; copied values become number, date and entity slots (see
:mod:`tools.corpus.compose`).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from typing import Any

from tools.corpus.compose import Doc, Flip, Gen, Part, fdate


def _doc(record: dict[str, Any], response: list[Part]) -> Doc:
    """The record as compact JSON text (one passage), no question."""
    return Doc(
        passages=(json.dumps(record, ensure_ascii=False),), question=None, response=tuple(response)
    )


def _yes_no(g: Gen, value: bool, yes: str, no: str) -> Flip:
    """A contradiction slot for a boolean field: the true wording, with the other as alt."""
    return g.flip(yes, no) if value else g.flip(no, yes)


def restaurant(g: Gen) -> Doc:
    """A nested restaurant listing: cuisine, stars, reviews, hours, seating, reservations."""
    name, city, street = g.fresh("venue"), g.town(), g.fresh("street")
    cui = g.fresh("cuisine")
    stars, reviews = g.pick_any((3.0, 3.5, 4.0, 4.5)), g.int(12, 900)
    opens, closes = g.int(11, 18), g.int(21, 23)
    outdoor, reserv = g.chance(0.5), g.chance(0.5)
    rec = {
        "name": name,
        "address": {"street": f"{g.int(1, 180)} {street}", "city": city},
        "categories": [cui, "Restaurants"],
        "stars": stars,
        "review_count": reviews,
        "hours": {"Tuesday-Sunday": f"{opens}:00-{closes}:00", "Monday": "closed"},
        "attributes": {"OutdoorSeating": outdoor, "RestaurantsReservations": reserv},
    }
    r: list[Part] = [
        g.ent(name, "venue"),
        ", on ",
        street,
        " in ",
        g.ent(city, "town"),
        ", serves ",
        g.ent(cui, "cuisine"),
        " food and has a rating of ",
        g.num(stars, "1f", lo=1, hi=5),
        " stars from ",
        g.num(reviews),
        " reviews",
        g.add(
            detail=[", most of them praising the desserts"],
            baseless=[", making it one of the most popular places in town"],
        ),
        ". It is open Tuesday to Sunday from ",
        g.when(dt.time(opens, 0)),
        " to ",
        g.when(dt.time(closes, 0)),
        " and closed on Mondays. It ",
        _yes_no(g, outdoor, "has outdoor seating", "has no outdoor seating"),
        " and ",
        _yes_no(g, reserv, "takes reservations", "does not take reservations"),
        ".",
        g.add(
            detail=[" Parking is available nearby."],
            baseless=[" It is a good choice for families."],
        ),
    ]
    return _doc(rec, r)


def business_listing(g: Gen) -> Doc:
    """A trades business: owner, town, founding year, staff, radius, call-outs."""
    name = g.fresh(
        lambda r: (
            f"{r.choice(('Swift', 'Reliable', 'Northside', 'Harbour', 'Keystone'))} {r.choice(('Plumbing', 'Locksmiths', 'Glaziers', 'Electricians', 'Roofing'))}"
        )
    )
    owner, city = g.person(), g.town()
    founded, staff, radius = g.int(1968, 2021), g.int(2, 45), g.int(5, 60)
    emergency = g.chance(0.5)
    rating = g.pick_any((3.8, 4.1, 4.4, 4.7, 4.9))
    rec = {
        "business_name": name,
        "owner": owner,
        "city": city,
        "founded": founded,
        "employees": staff,
        "service_radius_km": radius,
        "emergency_callouts": emergency,
        "rating": rating,
    }
    r: list[Part] = [
        name,
        ", run by ",
        g.ent(owner, "person"),
        ", is based in ",
        g.ent(city, "town"),
        " and was founded in ",
        g.when(founded),
        ". It has ",
        g.num(staff),
        " employees, covers an area within ",
        g.num(radius),
        " km",
        g.add(detail=[" of the town hall"], baseless=[", which keeps response times short"]),
        " and holds a rating of ",
        g.num(rating, "1f", lo=1, hi=5),
        ". It ",
        _yes_no(g, emergency, "offers emergency call-outs", "does not offer emergency call-outs"),
        ".",
        g.add(
            detail=[" Quotes are free of charge."], baseless=[" It is a trusted name in the area."]
        ),
    ]
    return _doc(rec, r)


def football_result(g: Gen) -> Doc:
    """A match record: teams, score, venue, ISO date, attendance, first goal."""
    home, away, venue = (
        g.fresh("club"),
        g.fresh("club"),
        g.fresh(
            lambda r: (
                f"{r.choice(('Mill', 'Harbour', 'Station', 'Orchard', 'Castle'))} {r.choice(('Park', 'Ground', 'Road', 'Stadium'))}"
            )
        ),
    )
    hs, as_ = g.int(0, 4), g.int(0, 4)
    while hs == as_:
        as_ = g.int(0, 4)
    scorer = g.person()
    d = g.date(2015, 2025)
    crowd = g.int(4, 60) * 250
    minute = g.int(5, 90)
    rec = {
        "competition": "Regional League",
        "date": d.isoformat(),
        "venue": venue,
        "home_team": home,
        "away_team": away,
        "score": {"home": hs, "away": as_},
        "attendance": crowd,
        "first_goal": {"player": scorer, "minute": minute},
    }
    winner, loser = (home, away) if hs > as_ else (away, home)
    hi, lo = max(hs, as_), min(hs, as_)
    r: list[Part] = [
        g.ent(winner, "club"),
        " ",
        g.flip("beat", "lost to"),
        " ",
        loser,
        " ",
        g.num(hi),
        "-",
        g.num(lo, lo=0),
        " at ",
        g.ent(venue, "venue"),
        " on ",
        g.when(d, "dmy"),
        " in a Regional League match watched by ",
        g.num(crowd, "comma"),
        " fans. ",
        g.ent(scorer, "person"),
        " opened the scoring after ",
        g.num(minute, lo=2),
        " minutes",
        g.add(detail=[" with a penalty"], baseless=[", setting the tone for the afternoon"]),
        ".",
        g.add(
            detail=[f" It was {home}'s first home game of the season."],
            baseless=[" The result was a surprise."],
        ),
    ]
    return _doc(rec, r)


def weather_report(g: Gen) -> Doc:
    """A daily forecast: condition, high/low, rain chance, wind, warning."""
    city = g.town()
    d = g.date(2019, 2026)
    hi = g.int(-2, 34)
    lo = hi - g.int(4, 12)
    rain, wind = g.int(0, 95, 5), g.int(5, 70)
    cond = g.pick(("sunny", "cloudy", "light rain", "showers", "snow", "fog"))
    warning = g.chance(0.4)
    rec = {
        "location": city,
        "forecast_date": d.isoformat(),
        "condition": cond,
        "temp_max_c": hi,
        "temp_min_c": lo,
        "precipitation_chance_pct": rain,
        "wind_kmh": wind,
        "weather_warning": warning,
    }
    phrase, *alts = {
        "sunny": ("sunshine", "heavy rain", "snow", "thunderstorms"),
        "cloudy": ("cloudy skies", "clear skies", "heavy rain"),
        "light rain": ("light rain", "sunshine", "snow"),
        "showers": ("showers", "sunshine", "snow"),
        "snow": ("snow", "sunshine", "heavy rain"),
        "fog": ("fog", "sunshine", "thunderstorms"),
    }[cond]
    r: list[Part] = [
        "On ",
        g.when(d, "wdm"),
        ", ",
        g.ent(city, "town"),
        " can expect ",
        g.flip(phrase, *alts),
        " with a high of ",
        g.num(hi, lo=-30),
        " and a low of ",
        g.num(lo, lo=-40),
        " degrees. The chance of rain is ",
        g.num(rain, lo=0, hi=100),
        " percent and winds reach ",
        g.num(wind),
        " km/h",
        g.add(detail=[" from the north-west"], baseless=[", typical for the time of year"]),
        ". ",
        _yes_no(g, warning, "A weather warning is in force", "No weather warning has been issued"),
        ".",
        g.add(
            detail=[" Sunrise is at 06:40."],
            baseless=[" Conditions should improve later in the week."],
        ),
    ]
    return _doc(rec, r)


def laptop_spec(g: Gen) -> Doc:
    """A laptop spec sheet: release date, price, RAM, storage, weight, battery."""
    brand = g.fresh("brand")
    model = g.fresh(
        lambda r: (
            r.choice(("Aero", "Slate", "Vector", "Nimbus", "Orbit")) + " " + str(r.randint(13, 16))
        )
    )
    ram, storage, kg = (
        g.pick_any((8, 16, 32, 64)),
        g.pick_any((256, 512, 1024, 2048)),
        g.real(0.9, 2.6),
    )
    hours, price = g.int(6, 22), g.int(5, 30) * 100 - 1
    d = g.date(2020, 2026)
    touch = g.chance(0.5)
    rec = {
        "brand": brand,
        "model": model,
        "release_date": d.isoformat(),
        "specs": {
            "ram_gb": ram,
            "storage_gb": storage,
            "weight_kg": kg,
            "battery_hours": hours,
            "touchscreen": touch,
        },
        "price_eur": price,
    }
    r: list[Part] = [
        "The ",
        g.ent(brand, "brand"),
        " ",
        model,
        " laptop was released on ",
        g.when(d, "dmy"),
        " and costs ",
        g.num(price, "comma"),
        " euros. It has ",
        g.num(ram),
        " GB of RAM, ",
        g.num(storage, "comma"),
        " GB of storage and ",
        _yes_no(g, touch, "a touchscreen", "no touchscreen"),
        ", weighs ",
        g.num(kg, "1f"),
        " kg and lasts up to ",
        g.num(hours),
        " hours on battery",
        g.add(detail=[" with its 70 Wh cell"], baseless=[", enough for a full working day"]),
        ".",
        g.add(
            detail=[" It comes with a one-year warranty."], baseless=[" It is aimed at students."]
        ),
    ]
    return _doc(rec, r)


def flight_status(g: Gen) -> Doc:
    """A flight record: airline, route, date, times, gate, distance, status."""
    airline = g.fresh("airline")
    code = airline[:2].upper() + str(g.int(100, 989))
    a, b = g.town(), g.town()
    d = g.date(2021, 2026)
    dep = g.time(5, 21)
    dur = g.int(45, 300)
    arr_min = dep.hour * 60 + dep.minute + dur
    arr = dt.time((arr_min // 60) % 24, arr_min % 60)
    gate = g.pick(("A", "B", "C", "D")) + str(g.int(1, 40))
    delayed = g.chance(0.4)
    km = g.int(180, 2900)
    rec = {
        "flight": code,
        "airline": airline,
        "date": d.isoformat(),
        "from": a,
        "to": b,
        "scheduled_departure": fdate(dep, "time"),
        "scheduled_arrival": fdate(arr, "time"),
        "gate": gate,
        "distance_km": km,
        "status": "delayed" if delayed else "on time",
    }
    r: list[Part] = [
        "Flight ",
        code,
        " operated by ",
        g.ent(airline, "airline"),
        ", a ",
        g.num(km, "comma"),
        " km trip, leaves ",
        g.ent(a, "town"),
        " for ",
        g.ent(b, "town"),
        " on ",
        g.when(d, "dmy"),
        " at ",
        g.when(dep),
        " from gate ",
        gate,
        " and is due to land at ",
        g.when(arr),
        g.add(detail=[" at terminal 2"], baseless=[", a popular route with business travellers"]),
        ". The flight is currently ",
        _yes_no(g, delayed, "delayed", "on time"),
        ".",
        g.add(
            detail=[" Boarding starts 40 minutes before departure."],
            baseless=[" Passengers should expect busy security queues."],
        ),
    ]
    return _doc(rec, r)


def hotel_listing(g: Gen) -> Doc:
    """A camelCase hotel record: stars, rooms, price, check-in/out, amenities."""
    name = f"Hotel {g.fresh('surname')}"
    city = g.town()
    stars, rooms, price = g.int(2, 5), g.int(8, 220), g.int(55, 420)
    pool, pets = g.chance(0.5), g.chance(0.5)
    cin, cout = g.int(14, 16), g.int(10, 12)
    rec = {
        "hotelName": name,
        "city": city,
        "starRating": stars,
        "roomCount": rooms,
        "priceFromEUR": price,
        "checkIn": f"{cin}:00",
        "checkOut": f"{cout}:00",
        "amenities": {"pool": pool, "petsAllowed": pets, "freeWifi": True},
    }
    r: list[Part] = [
        name,
        " is a ",
        g.num(stars, lo=1, hi=5),
        "-star hotel in ",
        g.ent(city, "town"),
        " with ",
        g.num(rooms),
        " rooms from ",
        g.num(price),
        " euros a night",
        g.add(detail=[", breakfast included"], baseless=[", good value for the area"]),
        ". Check-in is from ",
        g.when(dt.time(cin, 0)),
        " and check-out by ",
        g.when(dt.time(cout, 0)),
        ". Wi-Fi is free, the hotel ",
        _yes_no(g, pool, "has a pool", "has no pool"),
        ", and pets ",
        _yes_no(g, pets, "are allowed", "are not allowed"),
        ".",
        g.add(
            detail=[" It has a rooftop bar."], baseless=[" It is especially popular with couples."]
        ),
    ]
    return _doc(rec, r)


def book_record(g: Gen) -> Doc:
    """A bibliographic record: title, author, publisher, year, pages, awards."""
    title, author, publisher = (
        g.fresh("title"),
        g.person(),
        g.fresh(
            lambda r: (
                f"{r.choice(('Heron', 'Lantern', 'Quarry', 'Bellwether', 'Tidewell'))} {r.choice(('Press', 'Books', 'House'))}"
            )
        ),
    )
    y, pages = g.int(1950, 2025), g.int(96, 720)
    genre = g.pick(
        (
            "crime novel",
            "collection of short stories",
            "memoir",
            "travel book",
            "historical novel",
            "children's book",
        )
    )
    prize = g.chance(0.5)
    rec = {
        "title": title,
        "author": author,
        "publisher": publisher,
        "year": y,
        "pages": pages,
        "genre": genre,
        "awards": ["Coastal Book Prize"] if prize else [],
        "language": "English",
    }
    r: list[Part] = [
        g.ent(title, "title"),
        " is a ",
        genre,
        " by ",
        g.ent(author, "person"),
        ", published by ",
        publisher,
        " in ",
        g.when(y),
        ". It runs to ",
        g.num(pages),
        " pages",
        g.add(
            detail=[" and has been translated into nine languages"],
            baseless=[", though it reads quickly"],
        ),
        " and ",
        _yes_no(g, prize, "won the Coastal Book Prize", "has won no awards"),
        ".",
        g.add(
            detail=[" A film version is in development."],
            baseless=[" It is considered the author's best work."],
        ),
    ]
    return _doc(rec, r)


def property_listing(g: Gen) -> Doc:
    """A property listing: bedrooms, floor area, year built, garden, price, agent."""
    street, city, agent = g.fresh("street"), g.town(), g.company()
    beds, area, price = g.int(1, 6), g.int(45, 260), g.int(90, 950) * 1000
    built = g.int(1890, 2022)
    garden = g.chance(0.5)
    kind = "house" if beds > 2 else "flat"
    rec = {
        "listing": {
            "address": f"{g.int(1, 99)} {street}, {city}",
            "type": kind,
        },
        "bedrooms": beds,
        "floor_area_m2": area,
        "year_built": built,
        "garden": garden,
        "asking_price": price,
        "agent": agent,
    }
    r: list[Part] = [
        "This ",
        g.num(beds),
        "-bedroom ",
        kind,
        " on ",
        street,
        " in ",
        g.ent(city, "town"),
        " has ",
        g.num(area),
        " square metres of floor space and ",
        _yes_no(g, garden, "a garden", "no garden"),
        ". It was built in ",
        g.when(built),
        g.add(detail=[" and renovated in 2019"], baseless=[" and has kept many original features"]),
        ". The asking price is ",
        g.num(price, "comma"),
        " euros, through ",
        g.ent(agent, "company"),
        ".",
        g.add(
            detail=[" It has off-street parking for two cars."],
            baseless=[" It would suit a young family."],
        ),
    ]
    return _doc(rec, r)


def job_posting(g: Gen) -> Doc:
    """A job advert: role, employer, salary, hours, start date, remote work."""
    co, city = g.company(), g.town()
    role = g.pick(
        (
            "Data Analyst",
            "Warehouse Supervisor",
            "Nurse Practitioner",
            "Software Tester",
            "Sous Chef",
            "Lab Technician",
        )
    )
    salary, hours = g.int(28, 85) * 1000, g.pick_any((20, 24, 32, 36, 38, 40))
    start = g.date(2022, 2026)
    remote = g.chance(0.5)
    contract = g.pick(("permanent", "fixed-term (12 months)"))
    rec = {
        "job_title": role,
        "employer": co,
        "location": city,
        "salary_eur_per_year": salary,
        "hours_per_week": hours,
        "start_date": start.isoformat(),
        "remote_possible": remote,
        "contract": contract,
    }
    r: list[Part] = [
        g.ent(co, "company"),
        " is hiring ",
        "an " if role[0] in "AEIOU" else "a ",
        role,
        " in ",
        g.ent(city, "town"),
        " on a ",
        contract,
        " contract. The job pays ",
        g.num(salary, "comma"),
        " euros a year for ",
        g.num(hours),
        " hours a week and starts on ",
        g.when(start, "dmy"),
        g.add(detail=[", with a signing bonus"], baseless=[", a competitive offer for the sector"]),
        ". Remote work ",
        _yes_no(g, remote, "is possible", "is not possible"),
        ".",
        g.add(
            detail=[" Applications close at the end of the month."],
            baseless=[" The role offers good chances of promotion."],
        ),
    ]
    return _doc(rec, r)


def concert_listing(g: Gen) -> Doc:
    """A concert listing: artist, venue, capacity, date, doors, price, sold out."""
    artist, venue, city = (
        g.person(),
        g.fresh(
            lambda r: (
                f"The {r.choice(('Corn Exchange', 'Old Mill', 'Palm House', 'Drill Hall', 'Ropeworks'))}"
            )
        ),
        g.town(),
    )
    d = g.date(2022, 2026)
    tm = g.time(18, 21, 15)
    price, cap = g.int(15, 90), g.int(2, 40) * 100
    sold = g.chance(0.4)
    rec = {
        "event": f"{artist} live",
        "venue": {"name": venue, "city": city, "capacity": cap},
        "date": d.isoformat(),
        "doors": fdate(tm, "time"),
        "ticket_price_eur": price,
        "sold_out": sold,
    }
    r: list[Part] = [
        g.ent(artist, "person"),
        " plays ",
        venue,
        " in ",
        g.ent(city, "town"),
        " on ",
        g.when(d, "wdm"),
        ", with doors opening at ",
        g.when(tm),
        ". Tickets cost ",
        g.num(price),
        " euros, and the ",
        g.num(cap, "comma"),
        "-capacity venue ",
        _yes_no(g, sold, "is sold out", "still has tickets"),
        g.add(
            detail=[", with a support act from 20:30"]
            if tm.hour < 20
            else [", with a support act on stage first"],
            baseless=[", unsurprisingly given the artist's following"],
        ),
        ".",
        g.add(
            detail=[" The show will last about two hours."],
            baseless=[" It is one of the most anticipated concerts of the year."],
        ),
    ]
    return _doc(rec, r)


def car_spec(g: Gen) -> Doc:
    """A car record: make, model year, power, seats, electric range or fuel use."""
    make = g.fresh("brand")
    model = g.fresh(
        lambda r: (
            r.choice(("Tern", "Marlin", "Sable", "Kestrel", "Otter"))
            + (" " + r.choice(("GT", "Estate", "Cross")) if r.random() < 0.5 else "")
        )
    )
    y, hp, seats = g.int(2012, 2026), g.int(70, 420), g.pick_any((2, 4, 5, 7))
    electric = g.chance(0.5)
    rng_ = g.int(220, 640)
    cons = g.real(3.8, 9.5)
    rec: dict[str, Any] = {
        "make": make,
        "model": model,
        "model_year": y,
        "power_hp": hp,
        "seats": seats,
        "electric": electric,
    }
    if electric:
        rec["range_km"] = rng_
    else:
        rec["fuel_l_per_100km"] = cons
    r: list[Part] = [
        "The ",
        g.when(y),
        " ",
        g.ent(make, "brand"),
        " ",
        model,
        " ",
        _yes_no(g, electric, "is an electric car", "is a petrol car"),
        " with ",
        g.num(hp),
        " horsepower and ",
        g.num(seats, lo=2, hi=9),
        " seats",
        g.add(
            detail=[", built in its maker's southern plant"],
            baseless=[", a practical choice for commuters"],
        ),
        ". ",
    ]
    if electric:
        r += ["Its range is ", g.num(rng_), " km."]
    else:
        r += ["It uses ", g.num(cons, "1f"), " litres of fuel per 100 km."]
    r.append(
        g.add(
            detail=[" It comes with a five-year warranty."],
            baseless=[" It is one of the best cars in its class."],
        )
    )
    return _doc(rec, r)


def train_departure(g: Gen) -> Doc:
    """A train record: route, stop, times, date, platform, changes, bicycles."""
    a, b, via = g.town(), g.town(), g.town()
    num = g.int(100, 9899)
    d = g.date(2021, 2026)
    dep = g.time(5, 22)
    dur = g.int(25, 240)
    am = dep.hour * 60 + dep.minute + dur
    arr = dt.time((am // 60) % 24, am % 60)
    plat, changes = g.int(1, 14), g.int(2, 3)
    bike = g.chance(0.5)
    rec = {
        "train": f"IC {num}",
        "date": d.isoformat(),
        "origin": a,
        "destination": b,
        "calls_at": [via],
        "departs": fdate(dep, "time"),
        "arrives": fdate(arr, "time"),
        "platform": plat,
        "changes": changes,
        "bicycles_allowed": bike,
    }
    r: list[Part] = [
        "Train IC ",
        str(num),
        " leaves ",
        g.ent(a, "town"),
        " at ",
        g.when(dep),
        " on ",
        g.when(d, "dmy"),
        " from platform ",
        g.num(plat),
        " and arrives in ",
        g.ent(b, "town"),
        " at ",
        g.when(arr),
        ", calling at ",
        g.ent(via, "town"),
        ". The journey has ",
        g.num(changes, lo=2, hi=5),
        " changes",
        g.add(detail=[" and a dining car"], baseless=[", making it the quickest option"]),
        ", and bicycles ",
        _yes_no(g, bike, "are allowed", "are not allowed"),
        " on board.",
        g.add(
            detail=[" Seat reservations are compulsory."],
            baseless=[" It is usually crowded at this hour."],
        ),
    ]
    return _doc(rec, r)


def quarterly_report(g: Gen) -> Doc:
    """A financial record: quarter, revenue, growth, profit, staff, CEO."""
    co, ceo = g.company(), g.person()
    q, y = g.int(1, 4), g.int(2016, 2025)
    rev, profit = g.real(20.0, 900.0), g.real(1.0, 90.0)
    growth = g.real(-12.0, 25.0)
    while abs(growth) < 0.5:
        growth = g.real(-12.0, 25.0)
    staff = g.int(2, 90) * 100
    rec = {
        "company": co,
        "period": f"Q{q} {y}",
        "revenue_m_eur": rev,
        "net_profit_m_eur": profit,
        "revenue_growth_pct": growth,
        "employees": staff,
        "ceo": ceo,
    }
    up = growth > 0
    r: list[Part] = [
        "In the ",
        ("first", "second", "third", "fourth")[q - 1],
        " quarter of ",
        g.when(y),
        ", revenue at ",
        g.ent(co, "company"),
        " ",
        _yes_no(g, up, "grew", "fell"),
        " by ",
        g.num(abs(growth), "1f"),
        " percent to ",
        g.num(rev, "1f"),
        " million euros, with a net profit of ",
        g.num(profit, "1f"),
        " million",
        g.add(detail=[", mostly from exports"], baseless=[", helped by lower energy prices"]),
        ". The company, led by ",
        g.ent(ceo, "person"),
        ", has ",
        g.num(staff, "comma"),
        " employees.",
        g.add(
            detail=[" It will pay a dividend in June."], baseless=[" Investors reacted positively."]
        ),
    ]
    return _doc(rec, r)


def recipe_card(g: Gen) -> Doc:
    """A recipe card: author, servings, prep/cook minutes, calories, vegetarian."""
    dish = g.pick(
        (
            "Leek and potato soup",
            "Lentil stew",
            "Apple crumble",
            "Spinach pancakes",
            "Baked trout",
            "Chickpea curry",
            "Walnut bread",
        )
    )
    author = g.person()
    serves, prep, cook, kcal = g.int(2, 8), g.int(5, 40, 5), g.int(10, 90, 5), g.int(180, 780)
    veg = g.chance(0.6) if dish != "Baked trout" else False
    difficulty = g.pick(("easy", "medium"))
    rec = {
        "recipe": dish,
        "author": author,
        "servings": serves,
        "prep_minutes": prep,
        "cook_minutes": cook,
        "kcal_per_serving": kcal,
        "vegetarian": veg,
        "difficulty": difficulty,
        "published": (pub := g.date(2012, 2025)).isoformat(),
    }
    r: list[Part] = [
        g.ent(author, "person"),
        "'s recipe for ",
        dish.lower(),
        ", published on ",
        g.when(pub, "dmy"),
        ", serves ",
        g.num(serves),
        " and takes ",
        g.num(prep),
        " minutes to prepare and ",
        g.num(cook),
        " minutes to cook",
        g.add(detail=[" in a cast-iron pot"], baseless=[", so it suits a busy weeknight"]),
        ". Each serving has ",
        g.num(kcal),
        " calories, the recipe is rated ",
        difficulty,
        ", and it ",
        _yes_no(g, veg, "is vegetarian", "is not vegetarian"),
        ".",
        g.add(
            detail=[" It freezes well for up to a month."], baseless=[" It is a family favourite."]
        ),
    ]
    return _doc(rec, r)


def medication_record(g: Gen) -> Doc:
    """A prescription: medicine, strength, doses, duration, start, prescriber."""
    drug, doctor = g.fresh("drug"), g.person()
    mg, per_day, days = g.pick_any((5, 10, 20, 50, 100, 250, 500)), g.int(2, 3), g.int(5, 30)
    start = g.date(2022, 2026)
    refills = g.int(2, 4)
    food = g.chance(0.5)
    rec = {
        "medication": drug,
        "strength_mg": mg,
        "doses_per_day": per_day,
        "duration_days": days,
        "start_date": start.isoformat(),
        "prescriber": f"Dr {doctor}",
        "take_with_food": food,
        "refills": refills,
    }
    r: list[Part] = [
        "Dr ",
        g.ent(doctor, "person"),
        " prescribed ",
        g.ent(drug, "drug"),
        " ",
        g.num(mg),
        " mg, to be taken ",
        g.num(per_day, lo=2, hi=6),
        " times a day ",
        _yes_no(g, food, "with food", "without food"),
        " for ",
        g.num(days),
        " days from ",
        g.when(start, "dmy"),
        g.add(
            detail=[" to treat a chest infection"],
            baseless=[", a standard course for this condition"],
        ),
        ". The prescription allows ",
        g.num(refills, lo=2, hi=6),
        " refills.",
        g.add(
            detail=[" Avoid alcohol during the course."],
            baseless=[" Side effects are unlikely at this dose."],
        ),
    ]
    return _doc(rec, r)


def film_listing(g: Gen) -> Doc:
    """A TitleCase film record: director, year, runtime, language, rating, subtitles."""
    title, director = g.fresh("title"), g.person()
    y, mins = g.int(1960, 2025), g.int(78, 175)
    rating = g.pick_any((5.9, 6.4, 6.8, 7.1, 7.5, 7.9, 8.2))
    genre = g.pick(("comedy", "thriller", "documentary", "drama", "animated film", "western"))
    lang = g.pick(("Portuguese", "Finnish", "Korean", "Dutch", "Greek", "Turkish"))
    subs = g.chance(0.5)
    rec = {
        "Title": title,
        "Director": director,
        "Year": y,
        "Runtime": f"{mins} min",
        "Genre": genre,
        "Language": lang,
        "UserRating": rating,
        "EnglishSubtitles": subs,
    }
    r: list[Part] = [
        g.ent(title, "title"),
        " is ",
        "an " if genre[0] in "aeiou" else "a ",
        lang,
        " ",
        genre,
        " from ",
        g.when(y),
        " directed by ",
        g.ent(director, "person"),
        ". It runs ",
        g.num(mins),
        " minutes and has a user rating of ",
        g.num(rating, "1f", lo=1, hi=10),
        g.add(
            detail=[" on a popular review site"], baseless=[", reflecting a loyal cult following"]
        ),
        ", and it ",
        _yes_no(g, subs, "is available with English subtitles", "has no English subtitles"),
        ".",
        g.add(
            detail=[" It was shot in black and white."],
            baseless=[" Critics consider it a classic of its genre."],
        ),
    ]
    return _doc(rec, r)


def attraction_info(g: Gen) -> Doc:
    """A visitor attraction: hours, adult/child prices, opening year, access."""
    town = g.town()
    kind = g.pick(("Castle", "Botanic Garden", "Railway Museum", "Aquarium", "Salt Mine"))
    name = f"{town} {kind}"
    opens, closes = g.int(8, 11), g.int(16, 19)
    adult, child = g.int(8, 28), 0
    child = g.int(3, adult - 2)
    founded = g.int(1870, 2005)
    access = g.chance(0.5)
    closed_on = g.pick(("Mondays", "25 December", "Tuesdays in winter"))
    rec = {
        "attraction": name,
        "opening_hours": {"daily": f"{opens:02d}:00-{closes}:00"},
        "tickets": {"adult": adult, "child": child, "currency": "EUR"},
        "opened_to_public": founded,
        "wheelchair_accessible": access,
        "closed_on": closed_on,
    }
    r: list[Part] = [
        "The ",
        g.ent(town, "town"),
        " ",
        kind,
        " is open daily from ",
        g.when(dt.time(opens, 0)),
        " to ",
        g.when(dt.time(closes, 0)),
        " except ",
        closed_on,
        ". Adult tickets cost ",
        g.num(adult),
        " euros and children's tickets ",
        g.num(child),
        " euros",
        g.add(
            detail=[", with a family ticket also on offer"],
            baseless=[", fair prices for a half-day visit"],
        ),
        ". It opened to the public in ",
        g.when(founded),
        " and ",
        _yes_no(g, access, "is wheelchair accessible", "is not wheelchair accessible"),
        ".",
        g.add(
            detail=[" Guided tours run twice a day."],
            baseless=[" It is the town's main tourist draw."],
        ),
    ]
    return _doc(rec, r)


def athlete_profile(g: Gen) -> Doc:
    """An athlete profile: birth date, club, height, titles, still active."""
    name, club = g.person(), g.fresh("club")
    sport = g.pick(("rower", "high jumper", "sprinter", "swimmer", "judoka", "cyclist"))
    born = g.date(1988, 2005)
    height, golds, silvers = g.int(158, 205), g.int(0, 6), g.int(0, 6)
    active = g.chance(0.6)
    rec = {
        "athlete": name,
        "discipline": sport,
        "club": club,
        "date_of_birth": born.isoformat(),
        "height_cm": height,
        "national_titles": {"gold": golds, "silver": silvers},
        "active": active,
    }
    r: list[Part] = [
        g.ent(name, "person"),
        ", born on ",
        g.when(born, "dmy"),
        ", is a ",
        sport,
        " for ",
        g.ent(club, "club"),
        " and is ",
        g.num(height),
        " cm tall. The athlete has won ",
        g.num(golds, lo=0),
        " national gold and ",
        g.num(silvers, lo=0),
        " silver medals",
        g.add(
            detail=[", all under coach Rhea Dalby"],
            baseless=[", an impressive haul for the discipline"],
        ),
        " and ",
        _yes_no(g, active, "is still competing", "has retired"),
        ".",
        g.add(
            detail=[" The athlete also holds a national junior record."],
            baseless=[" More titles seem likely."],
        ),
    ]
    return _doc(rec, r)


def air_quality(g: Gen) -> Doc:
    """An air-quality reading: time, PM2.5, NO2, index, category, trend."""
    city = g.town()
    station = f"{city} {g.pick(('Central', 'Harbour', 'Ring Road', 'Park'))}"
    d = g.date(2020, 2026)
    tm = g.time(6, 21, 60)
    pm25, no2, aqi = g.int(3, 85), g.int(8, 120), g.int(15, 180)
    cat = "good" if aqi <= 50 else "moderate" if aqi <= 100 else "unhealthy for sensitive groups"
    trend = g.pick(("rising", "falling", "stable"))
    rec = {
        "station": station,
        "timestamp": f"{d.isoformat()}T{fdate(tm, 'time')}",
        "pm2_5_ugm3": pm25,
        "no2_ugm3": no2,
        "aqi": aqi,
        "category": cat,
        "trend": trend,
    }
    others = [
        c for c in ("good", "moderate", "unhealthy for sensitive groups", "hazardous") if c != cat
    ]
    trend_alts = [t for t in ("rising", "falling", "stable") if t != rec["trend"]]
    r: list[Part] = [
        "At ",
        g.when(tm),
        " on ",
        g.when(d, "dmy"),
        ", the ",
        station,
        " station in ",
        g.ent(city, "town"),
        " measured ",
        g.num(pm25),
        " micrograms of PM2.5 and ",
        g.num(no2),
        " micrograms of nitrogen dioxide per cubic metre. The air quality index was ",
        g.num(aqi),
        ", rated ",
        g.flip(cat, *others),
        g.add(
            detail=[" by the regional environment agency"], baseless=[", mainly because of traffic"]
        ),
        ", and the trend is ",
        g.flip(trend, *trend_alts),
        ".",
        g.add(
            detail=[" The station was installed in 2015."],
            baseless=[" Residents with asthma should stay indoors."],
        ),
    ]
    return _doc(rec, r)


def election_district(g: Gen) -> Doc:
    """District results (a list of candidates): votes, turnout, recount."""
    district = g.town()
    c1, c2, c3 = g.person(), g.person(), g.person()
    v1 = g.int(4000, 20000)
    v2 = v1 - g.int(100, 3000)
    v3 = g.int(500, v2 - 100)
    turnout = g.real(38.0, 82.0)
    d = g.date(2014, 2026)
    recount = g.chance(0.3)
    rec = {
        "district": district,
        "election_date": d.isoformat(),
        "results": [
            {"candidate": c1, "party": "Civic Union", "votes": v1},
            {"candidate": c2, "party": "Green Alliance", "votes": v2},
            {"candidate": c3, "party": "Independent", "votes": v3},
        ],
        "turnout_pct": turnout,
        "recount_requested": recount,
    }
    r: list[Part] = [
        g.ent(c1, "person"),
        " of the Civic Union won the ",
        g.ent(district, "town"),
        " district on ",
        g.when(d, "dmy"),
        " with ",
        g.num(v1, "comma"),
        " votes, ahead of ",
        g.ent(c2, "person"),
        " of the Green Alliance with ",
        g.num(v2, "comma"),
        " and the independent ",
        c3,
        " with ",
        g.num(v3, "comma"),
        ". Turnout was ",
        g.num(turnout, "1f", hi=100),
        " percent",
        g.add(
            detail=[", up four points on the last election"],
            baseless=[", reflecting strong interest in local issues"],
        ),
        ", and ",
        _yes_no(g, recount, "a recount has been requested", "no recount has been requested"),
        ".",
        g.add(
            detail=[" The count finished shortly after midnight."],
            baseless=[" The result was closer than expected."],
        ),
    ]
    return _doc(rec, r)


def parcel_tracking(g: Gen) -> Doc:
    """A parcel record: carrier, route, weight, shipped and expected dates."""
    carrier = g.company()
    tid = g.pick(("PX", "TR", "QL")) + str(g.int(10000000, 99999999))
    a, b = g.town(), g.town()
    kg = g.real(0.2, 25.0)
    shipped = g.date(2022, 2026)
    eta = shipped + dt.timedelta(days=g.int(1, 6))
    sig = g.chance(0.5)
    rec = {
        "tracking_id": tid,
        "carrier": carrier,
        "origin": a,
        "destination": b,
        "weight_kg": kg,
        "shipped": shipped.isoformat(),
        "estimated_delivery": eta.isoformat(),
        "status": "in transit",
        "signature_required": sig,
    }
    r: list[Part] = [
        "Parcel ",
        tid,
        ", weighing ",
        g.num(kg, "1f"),
        " kg, was shipped by ",
        g.ent(carrier, "company"),
        " from ",
        g.ent(a, "town"),
        " to ",
        g.ent(b, "town"),
        " on ",
        g.when(shipped, "dmy"),
        " and is ",
        g.flip("in transit", "delivered", "held at customs"),
        ". Delivery is expected on ",
        g.when(eta, "dmy"),
        g.add(detail=[" before noon"], baseless=[", barring the usual weekend delays"]),
        ", and ",
        _yes_no(g, sig, "a signature is required", "no signature is required"),
        ".",
        g.add(
            detail=[" It is insured for 200 euros."],
            baseless=[" The sender has used this carrier before."],
        ),
    ]
    return _doc(rec, r)


def phone_plan(g: Gen) -> Doc:
    """A mobile plan: provider, data, monthly price, contract, 5G, roaming."""
    provider = g.company()
    plan = g.fresh(
        lambda r: (
            r.choice(("Flex", "Saver", "Unlimited", "Go", "Smart"))
            + " "
            + r.choice(("S", "M", "L", "XL", "Plus"))
        )
    )
    gb, price, months = (
        g.pick_any((5, 10, 20, 40, 80, 150)),
        g.real(6.0, 45.0, 2),
        g.pick_any((1, 12, 24)),
    )
    five_g, roaming = g.chance(0.6), g.chance(0.5)
    rec = {
        "provider": provider,
        "plan": plan,
        "data_gb": gb,
        "monthly_price_eur": price,
        "contract_months": months,
        "features": {"5g": five_g, "eu_roaming": roaming},
        "offer_ends": (end := g.date(2023, 2026)).isoformat(),
    }
    r: list[Part] = [
        "The ",
        plan,
        " plan from ",
        g.ent(provider, "company"),
        " gives you ",
        g.num(gb),
        " GB of data for ",
        g.num(price, "2f"),
        " euros a month on a ",
        g.num(months, hi=36),
        "-month contract",
        g.add(
            detail=[", with unlimited calls and texts"],
            baseless=[", one of the cheapest deals available"],
        ),
        ". It ",
        _yes_no(g, five_g, "includes 5G", "does not include 5G"),
        " and ",
        _yes_no(g, roaming, "covers EU roaming", "does not cover EU roaming"),
        ".",
        " The offer ends on ",
        g.when(end, "dmy"),
        ".",
        g.add(detail=[" There is no activation fee."], baseless=[" It suits light users best."]),
    ]
    return _doc(rec, r)


def race_result(g: Gen) -> Doc:
    """A running-race result: runner, club, place, date, time, finishers, PB."""
    race = f"{g.town()} {g.pick(('Half Marathon', '10K', 'Marathon', 'Trail Race'))}"
    runner, club = g.person(), g.fresh("club")
    d = g.date(2014, 2026)
    kind = race.rsplit(" ", 1)[-1] if not race.endswith("Half Marathon") else "Half"
    lo_min, hi_min = {
        "10K": (29, 58),
        "Half": (64, 125),
        "Marathon": (131, 270),
        "Race": (70, 200),
    }[kind]
    total = g.int(lo_min, hi_min)
    h, m, s = total // 60, total % 60, g.int(0, 59)
    finishers, pos = g.int(200, 9000), g.int(1, 3)
    pb = g.chance(0.5)
    time_s = f"{h}:{m:02d}:{s:02d}"
    rec = {
        "race": race,
        "date": d.isoformat(),
        "runner": runner,
        "club": club,
        "position": pos,
        "finish_time": time_s,
        "finishers": finishers,
        "personal_best": pb,
    }
    place = ("first", "second", "third")[pos - 1]
    alts = [p for p in ("first", "second", "third", "fifth") if p != place]
    r: list[Part] = [
        g.ent(runner, "person"),
        " of ",
        g.ent(club, "club"),
        " finished ",
        g.flip(place, *alts),
        " in the ",
        race,
        " on ",
        g.when(d, "dmy"),
        " in ",
        time_s,
        ", out of ",
        g.num(finishers, "comma"),
        " finishers",
        g.add(detail=[", just ahead of a clubmate"], baseless=[", despite the warm conditions"]),
        ". The time ",
        _yes_no(g, pb, "was a personal best", "was not a personal best"),
        ".",
        g.add(
            detail=[" The course record still stands."],
            baseless=[" It was the runner's strongest race of the season."],
        ),
    ]
    return _doc(rec, r)


TEMPLATES: dict[str, Callable[[Gen], Doc]] = {
    f.__name__: f
    for f in (
        restaurant, business_listing, football_result, weather_report, laptop_spec, flight_status, hotel_listing,
        book_record, property_listing, job_posting, concert_listing, car_spec, train_departure, quarterly_report,
        recipe_card, medication_record, film_listing, attraction_info, athlete_profile, air_quality,
        election_district, parcel_tracking, phone_plan, race_result,
    )
}  # fmt: skip
"""Data-to-text templates by name (the build order)."""
